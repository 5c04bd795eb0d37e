"""The Get-a-model dialog through the real widgets (offscreen): the catalogue with sizes and
memory, a download from a mirror (a local stand-in of the hub) selected in the model dialog
ready to load, cancel, and a failure shown in the dialog."""

from pathlib import Path

import pytest
from fake_hub import FakeHub
from gui_helpers import data_dir, make_window  # noqa: F401 (fixtures)
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from merlin.app.model import downloads
from merlin.app.model.catalogue import CATALOGUE
from merlin.app.widgets.get_model_dialog import GetModelDialog, models_dir
from merlin.app.widgets.model_dialog import ModelChoice, ModelDialog

REPO = "Qwen/Qwen3-VL-2B-Instruct"


@pytest.fixture
def hub_files(demo_dir):
    return {p.name: p.read_bytes() for p in Path(demo_dir).iterdir() if p.is_file()}


def _use_mirror(dialog, url):
    dialog.source.setCurrentIndex(dialog.source.findData("mirror"))
    dialog.mirror.setText(url)
    dialog.select(REPO)


def test_catalogue_lists_sizes_and_memory(qtbot, data_dir):
    dialog = GetModelDialog(available_memory=6 << 30)
    qtbot.addWidget(dialog)
    assert dialog.table.rowCount() == len(CATALOGUE) == 6
    names = [dialog.table.item(r, 0).text() for r in range(6)]
    assert "Qwen3-VL-2B-Instruct" in names and "Qwen3-VL-8B-Thinking" in names
    row8 = names.index("Qwen3-VL-8B-Instruct")
    assert "GB" in dialog.table.item(row8, 1).text()
    assert "too big" in dialog.table.item(row8, 3).text()  # q8 of 8B needs more than 6 GB
    assert "too big" not in dialog.table.item(names.index("Qwen3-VL-2B-Instruct"), 2).text()


def test_download_from_a_mirror_is_selected_ready_to_load(qtbot, data_dir, hub_files):
    models = ModelDialog(ModelChoice("demo", "q4", "q8"), [])
    qtbot.addWidget(models)
    with FakeHub(REPO, hub_files) as hub:
        get = models.open_get_model()
        _use_mirror(get, hub.url)
        qtbot.mouseClick(get.download_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: get.folder is not None, timeout=60_000)
    folder = models_dir() / "Qwen--Qwen3-VL-2B-Instruct"
    assert get.folder == folder and not downloads.is_incomplete(folder)
    assert models.source() == str(folder)
    assert models.buttons.button(QDialogButtonBox.Ok).isEnabled()  # a loadable checkpoint
    again = ModelDialog(ModelChoice("demo", "q4", "q8"), [])
    qtbot.addWidget(again)
    assert again._find(str(folder)) is not None  # downloaded models are listed next time


def test_cancel_and_failure_are_shown(qtbot, data_dir, hub_files):
    dialog = GetModelDialog(available_memory=None)
    qtbot.addWidget(dialog)
    big = dict(hub_files, **{"model-00002-of-00002.safetensors": b"\0" * (8 << 20)})
    with FakeHub(REPO, big) as hub:
        hub.slow = True
        _use_mirror(dialog, hub.url)
        dialog.start()
        qtbot.waitUntil(lambda: dialog.progress.value() > 0, timeout=30_000)
        qtbot.mouseClick(dialog.cancel_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: not dialog.busy, timeout=30_000)
        assert "cancelled" in dialog.status.text() and dialog.folder is None
        assert dialog.download_button.isEnabled()
    dialog.mirror.setText("not a url")
    dialog.start()
    assert "mirror's address" in dialog.status.text() and not dialog.busy


def test_busy_until_the_end_is_shown(qtbot, data_dir, monkeypatch):
    """The thread ends before its last signal reaches the GUI thread: the dialog stays busy
    (download button off) until the failure is on screen (a race CI hit once)."""

    def fail(*_args, **_kwargs):
        raise downloads.DownloadError("the mirror said no")

    monkeypatch.setattr(downloads, "download_checkpoint", fail)
    dialog = GetModelDialog(available_memory=None)
    qtbot.addWidget(dialog)
    _use_mirror(dialog, "http://127.0.0.1:9")
    dialog.start()
    dialog._thread.join(timeout=30)  # ended; its signal is still queued
    assert dialog.busy and not dialog.download_button.isEnabled()
    qtbot.waitUntil(lambda: not dialog.busy, timeout=30_000)
    assert dialog.status.text() == "the mirror said no" and dialog.download_button.isEnabled()


def test_progress_past_two_gigabytes(qtbot, data_dir):
    """Every catalogue model is over 2 GB: the byte counts went through a C int, and the
    dialog read "95.4 MB of -38.1 MB" with a bar that never moved."""
    dialog = GetModelDialog(available_memory=None)
    qtbot.addWidget(dialog)
    dialog.progress.setRange(0, 1000)
    dialog._relay.sig_progress.emit(3 << 30, 4_260_000_000, "model.safetensors")
    qtbot.waitUntil(lambda: dialog.progress.value() > 0, timeout=5000)
    assert dialog.progress.value() == int(1000 * (3 << 30) / 4_260_000_000)
    assert "3.0 GB of 4.0 GB" in dialog.status.text()  # GiB, as everywhere in the app


def test_a_download_not_finished_is_not_offered_as_a_model(qtbot, make_window, tmp_path, demo_dir):
    """A folder still being downloaded (or stopped half-way) had been accepted, and loading
    it blamed the checkpoint ("tensor ... is missing")."""
    import shutil

    from merlin.app.widgets.model_dialog import folder_problem

    folder = tmp_path / "Qwen--Qwen3-VL-2B-Instruct"
    shutil.copytree(demo_dir, folder)
    (folder / downloads.MARKER).write_text("http://mirror/Qwen/Qwen3-VL-2B-Instruct\n")
    assert "not finished; open Get a model" in folder_problem(str(folder))
    w = make_window(model=str(folder))
    assert w.controller.model is None
    assert "not finished; open Get a model" in w.model_banner.text()
