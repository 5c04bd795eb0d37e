"""Choose what to load: the demo, the 2B-shaped random checkpoint, a Qwen3-VL checkpoint found
in the Hugging Face cache, or any folder; and the weights and KV cache formats."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from merlin.app.i18n import tr
from merlin.app.model import downloads, hf_scan
from merlin.app.model.remote import REMOTE_SOURCE, RemoteConfig
from merlin.app.settings import KV_FORMATS, WEIGHT_CHOICES
from merlin.app.widgets.get_model_dialog import GetModelDialog, models_dir
from merlin.app.widgets.remote_dialog import RemoteBox
from merlin.app.worker import SOURCE_DEMO, SOURCE_RANDOM_2B

SOURCE_ROLE = Qt.UserRole + 1


@dataclass
class ModelChoice:
    source: str
    weights: str
    kv: str
    remote: RemoteConfig | None = None  # source == REMOTE_SOURCE: the server to use


def folder_problem(folder: str) -> str:
    """Why a folder is plainly not a checkpoint ('' when it may be one: the loader decides)."""
    path = Path(folder)
    if not path.is_dir():
        return tr("{folder} is not a folder.").format(folder=folder)
    if downloads.is_incomplete(path):
        return tr(
            "The download into {folder} is not finished; open Get a model… to resume it."
        ).format(folder=folder)
    if not (path / "config.json").is_file():
        return tr(
            "{folder} has no config.json, so it is not a Hugging Face checkpoint folder. Choose "
            "the folder that holds config.json and the .safetensors files."
        ).format(folder=folder)
    if not hf_scan.is_supported_folder(path):
        return tr(
            "{folder} is not a checkpoint Merlin runs (Qwen3-VL, Qwen3-VL-MoE or Qwen3-MoE: "
            "see config.json)."
        ).format(folder=folder)
    return ""


def downloaded_folders() -> list[Path]:
    """Complete checkpoints the Get-a-model dialog downloaded."""
    root = models_dir()
    if not root.is_dir():
        return []
    return sorted(
        f
        for f in root.iterdir()
        if f.is_dir() and (f / "config.json").is_file() and not downloads.is_incomplete(f)
    )


class ModelDialog(QDialog):
    def __init__(
        self,
        current: ModelChoice,
        recent: list[str],
        found: list[hf_scan.FoundCheckpoint] | None = None,
        parent=None,
    ):
        super().__init__(parent)
        self.setWindowTitle(tr("Load a model"))
        self.resize(640, 460)
        layout = QVBoxLayout(self)
        intro = QLabel(
            tr(
                "Choose a Qwen3-VL checkpoint. Converted weights are cached, so the next start is "
                "faster."
            )
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.list = QListWidget()
        layout.addWidget(self.list, 1)
        self._add(SOURCE_DEMO, tr("Demo model (tiny, trained on pictures of shapes)"))
        self._add(
            SOURCE_RANDOM_2B,
            tr(
                "Qwen3-VL-2B shapes with random weights (real-size speed figures; built once, "
                "4.3 GB)"
            ),
        )
        for cp in found if found is not None else hf_scan.find_checkpoints():
            label = f"{cp.name}   —   {cp.path}"
            if not cp.complete:
                label += "   " + tr("(incomplete download)")
            self._add(str(cp.path), label)
        for folder in downloaded_folders():
            if not self._find(str(folder)):
                self._add(str(folder), f"{folder.name}   —   {folder}")
        for folder in recent:
            if folder and not self._find(folder):
                self._add(folder, folder)
        self._add(
            REMOTE_SOURCE, tr("OpenAI-compatible server (vLLM, llama-server, merlin-cli serve…)")
        )
        self.browse = QPushButton(tr("Choose a folder…"))
        self.browse.clicked.connect(self.choose_folder)
        self.get_model = QPushButton(tr("Get a model…"))
        self.get_model.clicked.connect(self.open_get_model)
        row = QHBoxLayout()
        row.addWidget(self.browse)
        row.addWidget(self.get_model)
        row.addStretch(1)
        layout.addLayout(row)
        self.problem = QLabel()
        self.problem.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("color: #D0393E;")
        self.problem.setVisible(False)
        layout.addWidget(self.problem)
        form = QFormLayout()
        self.weights = QComboBox()
        for w, text in zip(
            WEIGHT_CHOICES,
            (
                tr("auto (q4 or q8, whichever runs faster on this CPU)"),
                tr("f32 (exact, 4 bytes per weight)"),
                tr("q8 (1.06 bytes per weight)"),
                tr("q4 (0.56 bytes per weight, fastest)"),
            ),
        ):
            self.weights.addItem(text, w)
        self.weights.setCurrentIndex(max(0, self.weights.findData(current.weights)))
        self.kv = QComboBox()
        for k, text in zip(KV_FORMATS, (tr("f32 (exact)"), tr("q8 (a quarter of the memory)"))):
            self.kv.addItem(text, k)
        self.kv.setCurrentIndex(max(0, self.kv.findData(current.kv)))
        form.addRow(tr("Weights"), self.weights)
        form.addRow(tr("KV cache"), self.kv)
        self.formats = QWidget()
        self.formats.setLayout(form)
        layout.addWidget(self.formats)
        self.remote = RemoteBox(current.remote)
        self.remote.url.textChanged.connect(self._check)
        layout.addWidget(self.remote)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.buttons.button(QDialogButtonBox.Ok).setText(tr("Load"))
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.list.currentItemChanged.connect(self._check)
        item = self._find(current.source or SOURCE_DEMO)
        self.list.setCurrentItem(item or self.list.item(0))

    def _add(self, source: str, label: str) -> QListWidgetItem:
        item = QListWidgetItem(label)
        item.setData(SOURCE_ROLE, source)
        item.setToolTip(source)
        self.list.addItem(item)
        return item

    def _find(self, source: str) -> QListWidgetItem | None:
        for i in range(self.list.count()):
            if self.list.item(i).data(SOURCE_ROLE) == source:
                return self.list.item(i)
        return None

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, tr("Checkpoint folder"))
        if folder:
            self.select_folder(folder)

    def open_get_model(self) -> GetModelDialog:
        """The Get-a-model dialog; a finished download is selected here, ready to load."""
        from merlin.engine.memory import available_memory

        dialog = GetModelDialog(available_memory(), self)
        dialog.sig_downloaded.connect(self.select_folder)
        dialog.open()
        return dialog

    def select_folder(self, folder: str) -> None:
        item = self._find(folder) or self._add(folder, folder)
        self.list.setCurrentItem(item)

    def _check(self, *_):
        source = self.source()
        remote = source == REMOTE_SOURCE
        self.remote.setVisible(remote)
        self.formats.setVisible(not remote)
        if remote:
            problem = self.remote.problem()
        elif source in (SOURCE_DEMO, SOURCE_RANDOM_2B, ""):
            problem = ""
        else:
            problem = folder_problem(source)
        self.problem.setText(problem)
        self.problem.setVisible(bool(problem))
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(not problem)

    def source(self) -> str:
        item = self.list.currentItem()
        return item.data(SOURCE_ROLE) if item else SOURCE_DEMO

    def choice(self) -> ModelChoice:
        source = self.source()
        remote = self.remote.config() if source == REMOTE_SOURCE else None
        return ModelChoice(source, self.weights.currentData(), self.kv.currentData(), remote)
