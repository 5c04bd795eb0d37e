"""GUI test helpers and fixtures: a temporary data folder per test, windows on the demo
checkpoint, typing and waiting like a user. Test modules import the fixtures they use (a
tests/app is on sys.path: pyproject.toml, pythonpath)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# kernels compiled by the app's child process are stamped per test run, not in the user cache
if "MERLIN_KERNEL_STAMPS" not in os.environ:
    os.environ["MERLIN_KERNEL_STAMPS"] = tempfile.mkdtemp(prefix="merlin-kernels-")
    atexit.register(shutil.rmtree, os.environ["MERLIN_KERNEL_STAMPS"], ignore_errors=True)

# the first load on a cold Numba cache compiles the kernels: 70-90 s on the 2 idle cores of
# the dev box, over 120 s when the machine is busy with other work
LOAD_TIMEOUT_MS = 300_000
ANSWER_TIMEOUT_MS = 60_000


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """MERLIN_DATA_DIR for this test: chats, images and settings never touch the user's."""
    folder = tmp_path / "data"
    monkeypatch.setenv("MERLIN_DATA_DIR", str(folder))
    return folder


def app_settings(**overrides):
    from merlin.app.settings import AppSettings

    values = dict(language="en", max_new_tokens=12, panel_visible=True)
    values.update(overrides)
    return AppSettings(**values)


@pytest.fixture
def make_window(qtbot, demo_dir, data_dir):
    """make_window(model=None, wait=True, saved=False, **settings) -> a shown 1280x720
    MainWindow on the demo checkpoint (or `model`), loaded unless wait=False."""
    from merlin.app.widgets.window import MainWindow

    made = []

    def make(model: str | None = None, wait: bool = True, saved: bool = False, **settings):
        """saved=True: the settings the previous window saved in the data folder."""
        window = MainWindow(
            model_folder=str(demo_dir) if model is None else model,
            settings=None if saved else app_settings(**settings),
        )
        qtbot.addWidget(window)
        window.resize(1280, 720)
        window.show()
        made.append(window)
        if wait:
            qtbot.waitUntil(lambda: window.controller.loading is None, timeout=LOAD_TIMEOUT_MS)
        return window

    yield make
    for window in made:
        window.close()


def send(qtbot, window, text: str, wait: bool = True) -> None:
    """Type into the composer and press Enter, like a user."""
    from PySide6.QtCore import Qt

    window.composer.set_text(text)
    qtbot.keyClick(window.composer.edit, Qt.Key_Return)
    if wait:
        wait_idle(qtbot, window)


def wait_idle(qtbot, window) -> None:
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=ANSWER_TIMEOUT_MS)


def drafts_on_disk(folder):
    """Every readable draft file in a data folder, merged: what the next start would put
    back if no window were running (app/model/draft.py)."""
    from merlin.app.model.draft import DraftUnreadable, draft_files, merged, read_draft_file

    drafts = []
    for path in draft_files(folder):
        try:
            drafts.append(read_draft_file(path))
        except DraftUnreadable:
            pass
    return merged(drafts)
