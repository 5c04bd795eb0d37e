"""The chat's thinking switch (in the model bar): on where the loaded model's chat template
has a thinking block, disabled with a tooltip saying why where it has none.

The switch is the chat's (kept with it in the store, app/model/thought.py has the rules); it
follows the chat shown and the model loaded. Only a user's click (or Space) changes it.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QCheckBox

from merlin.app.i18n import tr
from merlin.app.model.thought import switch_state


class ThinkingSwitch(QCheckBox):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("thinkingSwitch")
        self._info = None  # the loaded model's ModelInfo
        self._switch: str | None = None  # the chat's: "on", "off", None (the default)
        self._model = None
        self.clicked.connect(self._on_clicked)
        self.retranslate()

    def bind(self, controller) -> None:
        """Follow controller's model and chat; the user's clicks go to the chat."""
        self._model = controller.conversation
        self._model.thinking_changed = self.show_switch
        controller.sig_model_changed.connect(self.set_model)
        self.set_model(controller.model)
        self.show_switch(self._model.thinking_switch)

    def set_model(self, info) -> None:
        self._info = info
        self._refresh()

    def show_switch(self, switch: str | None) -> None:
        self._switch = switch
        self._refresh()

    def _on_clicked(self, on: bool) -> None:
        self._switch = "on" if on else "off"
        if self._model is not None:
            self._model.set_thinking(self._switch)
        self._refresh()

    def _refresh(self) -> None:
        enabled, checked, tip = switch_state(self._info, self._switch, tr)
        self.setEnabled(enabled)
        self.setChecked(checked)
        self.setToolTip(tip)

    def retranslate(self) -> None:
        self.setText(tr("Thinking"))
        self._refresh()

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self.retranslate()
        super().changeEvent(event)
