"""Shared fixtures. Everything a test needs is made here or shipped in tests/fixtures."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# converted weights go to a per-run folder, never to the user's cache; removed at exit
_RUN_FOLDERS = [tempfile.mkdtemp(prefix=f"merlin-{what}-") for what in ("weights", "vspeed")]
atexit.register(lambda: [shutil.rmtree(f, ignore_errors=True) for f in _RUN_FOLDERS])
os.environ["MERLIN_WEIGHT_CACHE"] = _RUN_FOLDERS[0]
os.environ["MERLIN_VISION_SPEED"] = _RUN_FOLDERS[1] + "/speed.json"

# `--weights auto` (the default) resolves to q4 without timing the kernels, so that tests do
# not depend on this machine's timings; tests/engine/test_autoweights.py measures for real
os.environ.setdefault("MERLIN_AUTO_WEIGHTS", "q4")

# ---- the user's own folders are never written --------------------------------------------------
# The real data, config and cache folders are found now, snapshotted, and every variable that
# locates them (HOME, XDG_*, MERLIN_DATA_DIR, MERLIN_SESSION_CACHE) points at a per-run
# temporary folder for the whole run, child processes included. After every test the real
# folders are compared with the snapshot: a test that created, changed or deleted a file in
# them fails. The one shared folder is the compiled-kernel cache (numba/ under the user's
# cache: kernels take minutes to compile and hold no user data); it keeps its real location.
from user_folders import install_guard  # noqa: E402

_GUARD = install_guard()


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The small random-weight checkpoint, built by the real builder into a per-run folder
    (flat random logits: generation runs for as many tokens as a test asks)."""
    from merlin.engine.demo import ensure_random_demo_checkpoint

    return ensure_random_demo_checkpoint(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def shapes_dir() -> Path:
    """The shipped trained demo model (the default model): real answers about drawn shapes."""
    from merlin.engine.demo import ensure_demo_checkpoint

    return ensure_demo_checkpoint()


@pytest.fixture(scope="session")
def demo_model(demo_dir):
    from merlin.engine.model import load_model

    return load_model(demo_dir)


@pytest.fixture(autouse=True)
def _user_folders_untouched():
    """Fails the test that wrote into the user's real data, config or cache folders."""
    yield
    changed = _GUARD.changes()
    if changed:
        _GUARD.rebase()  # report each write once, at the test that made it
        pytest.fail(
            "this test wrote into the user's own folders: " + ", ".join(changed[:10]),
            pytrace=False,
        )
