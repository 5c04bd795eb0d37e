"""The "< 2/3 >" switch in a message's header: which version of the message is shown.

A message has versions when it was edited (a question) or regenerated (an answer); the store
keeps them all (model/store_tree.py). The buttons take the keyboard focus with Tab and are
pressed with Space, each has a tooltip; the switch is hidden while a message has one version.
What a step does is the conversation model's (model/branching.py): this only asks.

sig_step(int): -1 for the previous version, +1 for the next.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget

from merlin.app.i18n import tr


class VersionSwitch(QWidget):
    sig_step = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.version, self.count = 1, 1
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.prev_button = self._button("‹", -1)
        self.label = QLabel()
        self.label.setAlignment(Qt.AlignCenter)
        self.next_button = self._button("›", +1)
        for w in (self.prev_button, self.label, self.next_button):
            layout.addWidget(w)
        self.setVisible(False)
        self.retranslate()

    def _button(self, text: str, step: int) -> QToolButton:
        b = QToolButton(self)
        b.setText(text)
        b.setAutoRaise(True)
        b.setFocusPolicy(Qt.StrongFocus)  # reachable with Tab, pressed with Space
        b.clicked.connect(lambda: self.sig_step.emit(step))
        return b

    def set_versions(self, version: int, count: int) -> None:
        """Version `version` (1-based) of `count` is shown."""
        self.version, self.count = version, count
        self.label.setText(f"{version}/{count}")
        self.prev_button.setEnabled(version > 1)
        self.next_button.setEnabled(version < count)
        self.setVisible(count > 1)
        self.retranslate()

    @property
    def text(self) -> str:
        return self.label.text()

    def retranslate(self) -> None:
        for b, what in (
            (self.prev_button, tr("Previous version")),
            (self.next_button, tr("Next version")),
        ):
            b.setToolTip(what)
            b.setAccessibleName(what)
        where = tr("Version {n} of {count}").format(n=self.version, count=self.count)
        self.label.setToolTip(where)
        self.label.setAccessibleName(where)

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self.retranslate()
        super().changeEvent(event)
