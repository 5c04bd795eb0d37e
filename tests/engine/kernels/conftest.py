"""Starts test_classes.py's per-class builds as soon as the session knows it will run one of
its tests, and runs those tests last, so that the builds' minutes of compiling overlap the
whole rest of the suite."""

from pathlib import Path

CLASSES = Path(__file__).with_name("test_classes.py")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path == CLASSES)  # stable: the others keep their order


def pytest_collection_finish(session):
    if session.config.option.collectonly or session.testsfailed:
        return  # nothing will run
    for item in session.items:
        if item.path == CLASSES:
            item.module.start_builds()
            return
