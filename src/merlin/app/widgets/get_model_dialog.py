"""Get a model: the Qwen3-VL checkpoints Merlin supports, with their download size and the
memory each weights format needs on this machine, downloaded with progress and cancel from
the Hugging Face hub, a mirror, or ModelScope (where its package is installed).

The transfer runs on a Python thread (merlin.app.model.downloads, Qt-free); its progress
reaches the dialog through a queued signal, so the window never waits for the network.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from merlin.app.i18n import tr
from merlin.app.model import downloads
from merlin.app.model.catalogue import CATALOGUE, Entry
from merlin.app.model.paths import data_dir
from merlin.app.model.perf_stats import format_bytes

SOURCE_HUB, SOURCE_MIRROR, SOURCE_MODELSCOPE = "hub", "mirror", "modelscope"
HF_MIRROR_EXAMPLE = "https://hf-mirror.com"


def models_dir() -> Path:
    """Downloaded checkpoints live in the user data folder."""
    return data_dir() / "models"


def modelscope_available() -> bool:
    return importlib.util.find_spec("modelscope") is not None


class _Relay(QObject):
    """Carries the download thread's news to the GUI thread (queued connections)."""

    sig_progress = Signal(
        object, object, str
    )  # done bytes, total bytes (past 2 GB: no C int), file
    sig_finished = Signal(str)  # the checkpoint folder
    sig_failed = Signal(str)  # what went wrong, for the user


class GetModelDialog(QDialog):
    """sig_downloaded(folder) once a checkpoint is complete; the dialog then closes."""

    sig_downloaded = Signal(str)

    def __init__(self, available_memory: int | None = None, parent=None):
        super().__init__(parent)
        self.setWindowTitle(tr("Get a model"))
        self.resize(760, 480)
        self.available = available_memory
        self.folder: Path | None = None
        self._thread: threading.Thread | None = None
        self._downloading = False  # from start() until its end is shown (not: thread alive)
        self._cancel = threading.Event()
        self._relay = _Relay()
        self._relay.sig_progress.connect(self.on_progress, Qt.QueuedConnection)
        self._relay.sig_finished.connect(self.on_finished, Qt.QueuedConnection)
        self._relay.sig_failed.connect(self.on_failed, Qt.QueuedConnection)

        layout = QVBoxLayout(self)
        intro = QLabel(
            tr(
                "Checkpoints Merlin supports. Memory is what loading needs with an 8,192-token "
                "context and a picture; weights are converted on the first load. Downloads go "
                "to {folder} and resume if they stop."
            ).format(folder=models_dir())
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.table = QTableWidget(len(CATALOGUE), 5)
        self.table.setHorizontalHeaderLabels(
            [tr("Model"), tr("Download"), tr("Memory q4"), tr("Memory q8"), tr("Here")]
        )
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        for row, entry in enumerate(CATALOGUE):
            self._fill_row(row, entry)
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.selectRow(0)
        layout.addWidget(self.table, 1)

        form = QFormLayout()
        self.source = QComboBox()
        self.source.addItem(tr("Hugging Face hub"), SOURCE_HUB)
        self.source.addItem(tr("A mirror of the hub"), SOURCE_MIRROR)
        self.source.addItem(tr("ModelScope"), SOURCE_MODELSCOPE)
        if not modelscope_available():
            item = self.source.model().item(2)
            item.setEnabled(False)
            item.setToolTip(tr("Install the modelscope package to download from ModelScope."))
        self.mirror = QLineEdit(os.environ.get("HF_ENDPOINT", ""))
        self.mirror.setPlaceholderText(HF_MIRROR_EXAMPLE)
        if os.environ.get("HF_ENDPOINT"):
            self.source.setCurrentIndex(1)
        self.source.currentIndexChanged.connect(self._update_mirror)
        form.addRow(tr("From"), self.source)
        form.addRow(tr("Mirror address"), self.mirror)
        layout.addLayout(form)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        layout.addWidget(self.progress)
        self.status = QLabel()
        self.status.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Close)
        self.download_button = QPushButton(tr("Download"))
        self.cancel_button = QPushButton(tr("Cancel download"))
        self.cancel_button.setEnabled(False)
        self.buttons.addButton(self.download_button, QDialogButtonBox.ActionRole)
        self.buttons.addButton(self.cancel_button, QDialogButtonBox.ActionRole)
        self.download_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self._update_mirror()

    # ---- the table -------------------------------------------------------------------------

    def _fill_row(self, row: int, entry: Entry) -> None:
        cells = [entry.name, format_bytes(entry.download_bytes())]
        for fmt in ("q4", "q8"):
            need = entry.memory_bytes(fmt)
            text = format_bytes(need)
            if self.available is not None and need > self.available:
                text += "  " + tr("(too big here)")
            cells.append(text)
        folder = models_dir() / entry.repo_id.replace("/", "--")
        if folder.is_dir():
            here = tr("partly") if downloads.is_incomplete(folder) else tr("downloaded")
        else:
            here = ""
        cells.append(here)
        for col, text in enumerate(cells):
            self.table.setItem(row, col, QTableWidgetItem(text))

    def selected(self) -> Entry:
        rows = self.table.selectionModel().selectedRows()
        return CATALOGUE[rows[0].row() if rows else 0]

    def select(self, repo_id: str) -> None:
        for row, entry in enumerate(CATALOGUE):
            if entry.repo_id == repo_id:
                self.table.selectRow(row)

    def _update_mirror(self, *_):
        self.mirror.setEnabled(self.source.currentData() == SOURCE_MIRROR)

    # ---- downloading -----------------------------------------------------------------------

    def start(self) -> None:
        if self.busy:
            return
        entry = self.selected()
        source = self.source.currentData()
        endpoint = None
        if source == SOURCE_MIRROR:
            endpoint = self.mirror.text().strip()
            if not endpoint.startswith(("http://", "https://")):
                self.status.setText(
                    tr("Enter the mirror's address, e.g. {example}").format(
                        example=HF_MIRROR_EXAMPLE
                    )
                )
                return
        self._cancel = threading.Event()
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self.status.setText(tr("Downloading {name}…").format(name=entry.name))
        self.download_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self._thread = threading.Thread(
            target=self._run, args=(entry, source, endpoint), name="merlin-download", daemon=True
        )
        self._downloading = True
        self._thread.start()

    def _run(self, entry: Entry, source: str, endpoint: str | None) -> None:
        relay = self._relay
        try:
            if source == SOURCE_MODELSCOPE:
                folder = downloads.download_from_modelscope(entry.repo_id, models_dir())
            else:
                folder = downloads.download_checkpoint(
                    entry.repo_id,
                    models_dir(),
                    endpoint=endpoint,
                    on_progress=lambda p: relay.sig_progress.emit(
                        p.done_bytes, max(1, p.total_bytes), p.file
                    ),
                    cancel=self._cancel,
                )
        except downloads.DownloadError as e:
            relay.sig_failed.emit(str(e))
        except Exception as e:  # never a traceback in the window
            relay.sig_failed.emit(tr("The download failed: {why}").format(why=e))
        else:
            relay.sig_finished.emit(str(folder))

    def cancel(self) -> None:
        self._cancel.set()
        self.cancel_button.setEnabled(False)
        self.status.setText(tr("Stopping the download…"))

    @property
    def busy(self) -> bool:
        """A download runs or its end has not been shown yet: the thread ends before the
        GUI thread receives its last signal, so its liveness would say "done" too early."""
        return self._downloading

    def on_progress(self, done: int, total: int, file: str) -> None:
        self.progress.setValue(int(1000 * done / total))
        self.status.setText(
            tr("{file}: {done} of {total}").format(
                file=file, done=format_bytes(done), total=format_bytes(total)
            )
        )

    def on_finished(self, folder: str) -> None:
        self._downloading = False
        self.folder = Path(folder)
        self.progress.setValue(1000)
        self.status.setText(tr("Downloaded to {folder}").format(folder=folder))
        self.download_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.sig_downloaded.emit(folder)
        self.accept()

    def on_failed(self, message: str) -> None:
        self._downloading = False
        self.status.setText(message)
        self.download_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        for row, entry in enumerate(CATALOGUE):
            self._fill_row(row, entry)

    def reject(self) -> None:
        if self.busy:
            self.cancel()  # closing the dialog stops the transfer; what arrived is kept
        super().reject()
