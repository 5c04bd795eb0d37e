"""Starts test_classes.py's per-class builds as soon as the session knows it will run one of
its tests, so that their minutes of compiling overlap the rest of the suite."""

from pathlib import Path

CLASSES = Path(__file__).with_name("test_classes.py")


def pytest_collection_finish(session):
    for item in session.items:
        if item.path == CLASSES:
            item.module.start_builds()
            return
