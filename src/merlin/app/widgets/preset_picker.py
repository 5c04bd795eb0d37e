"""The system-prompt preset row of the Settings dialog: pick a preset to fill the prompt, save
the prompt as a preset of your own, delete one of yours (merlin.app.model.presets)."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QInputDialog,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QWidget,
)

from merlin.app.i18n import N_, tr
from merlin.app.model.paths import data_dir
from merlin.app.model.presets import PresetError, Presets

# the shipped presets' names, marked for translation (merlin.app.model.presets.SHIPPED)
SHIPPED_NAMES = (
    N_("Default"),
    N_("Concise"),
    N_("Describe pictures in detail"),
    N_("Step by step"),
    N_("Answer in Chinese"),
)


class PresetPicker(QWidget):
    def __init__(self, prompt: QPlainTextEdit, presets: Presets | None = None, parent=None):
        super().__init__(parent)
        self.prompt = prompt
        self.presets = presets if presets is not None else Presets(data_dir())
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.combo = QComboBox()
        self.save_button = QPushButton()
        self.delete_button = QPushButton()
        row.addWidget(self.combo, 1)
        row.addWidget(self.save_button)
        row.addWidget(self.delete_button)
        self.combo.activated.connect(self._chosen)
        self.combo.currentIndexChanged.connect(self._sync)
        self.save_button.clicked.connect(lambda: self.save_as())
        self.delete_button.clicked.connect(self.delete_current)
        self.retranslate()

    def retranslate(self) -> None:
        self.save_button.setText(tr("Save as preset…"))
        self.delete_button.setText(tr("Delete preset"))
        self._fill()

    def _fill(self, select: str | None = None) -> None:
        current = select or self.combo.currentData()
        self.combo.blockSignals(True)
        self.combo.clear()
        for name in self.presets.names():
            label = name if self.presets.is_user(name) else tr(name)
            self.combo.addItem(label, name)
        match = self.combo.findData(current) if current else -1
        if match < 0:  # the preset whose prompt is in the editor, if any
            text = self.prompt.toPlainText()
            match = next((i for i, n in enumerate(self.presets.names())
                          if self.presets.prompt(n) == text), 0)  # fmt: skip
        self.combo.setCurrentIndex(match)
        self.combo.blockSignals(False)
        self._sync()

    def _sync(self, *_):
        self.delete_button.setEnabled(self.presets.is_user(self.combo.currentData() or ""))

    def _chosen(self, index: int) -> None:
        self.prompt.setPlainText(self.presets.prompt(self.combo.itemData(index)))

    def save_as(self, name: str | None = None) -> bool:
        if name is None:
            name, ok = QInputDialog.getText(self, tr("Save as preset"), tr("Preset name"))
            if not ok:
                return False
        try:
            self.presets.save(name, self.prompt.toPlainText())
        except PresetError as e:
            QMessageBox.warning(self, tr("Save as preset"), str(e))
            return False
        self._fill(select=name.strip())
        return True

    def delete_current(self) -> None:
        name = self.combo.currentData()
        if name and self.presets.is_user(name):
            try:
                self.presets.delete(name)
            except PresetError as e:
                QMessageBox.warning(self, tr("Delete preset"), str(e))
                return
            self._fill()
