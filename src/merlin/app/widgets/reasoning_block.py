"""A thinking model's reasoning above its answer: a collapsed block ("Thinking… 12 s" while it
streams, "Thought for 12 s" after) that a click, or Space on its focused header, expands.

Cheap while thousands of reasoning tokens stream: collapsed, only the header's label changes
(at most once a second, or when the block ends); expanded, only the new characters are
appended to a plain-text view (never a re-render of the whole text). The reasoning is shown
as plain text (LaTeX and code as written): it is the model's scratch work, and plain text
costs nothing to lay out. It is never part of the answer's text, so "Copy" leaves it out.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QFrame, QPlainTextEdit, QSizePolicy, QToolButton, QVBoxLayout

from merlin.app.i18n import tr
from merlin.app.model.thought import thinking_label
from merlin.app.widgets import theme

BODY_MAX_LINES = 16  # the expanded body scrolls past this many lines


class ReasoningBlock(QFrame):
    """sig_expanded(bool): the user expanded or collapsed the block."""

    sig_expanded = Signal(bool)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("reasoningBlock")
        self.text = ""
        self.seconds = 0.0
        self.streaming = False
        self._shown = ""  # what the body holds
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        self.header = QToolButton(self)
        self.header.setObjectName("reasoningHeader")
        self.header.setCheckable(True)
        self.header.setAutoRaise(True)
        self.header.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.header.setArrowType(Qt.RightArrow)
        self.header.setFocusPolicy(Qt.StrongFocus)
        self.header.toggled.connect(self._on_toggled)
        layout.addWidget(self.header, 0, Qt.AlignLeft)
        self.body = QPlainTextEdit(self)
        self.body.setObjectName("reasoningBody")
        self.body.setReadOnly(True)
        self.body.setFrameShape(QFrame.NoFrame)
        self.body.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Maximum)
        self.body.setVisible(False)
        pal = self.body.palette()
        pal.setColor(pal.ColorRole.Text, theme.muted_text())
        self.body.setPalette(pal)
        line = self.body.fontMetrics().lineSpacing()
        self.body.setMaximumHeight(line * BODY_MAX_LINES + 12)
        layout.addWidget(self.body)
        self._update_header()

    @property
    def expanded(self) -> bool:
        return self.header.isChecked()

    def set_content(self, text: str, seconds: float, streaming: bool) -> None:
        self.text, self.seconds, self.streaming = text, seconds, streaming
        self._update_header()
        if self.expanded:
            self._sync_body()

    def set_expanded(self, on: bool) -> None:
        self.header.setChecked(bool(on))

    def _on_toggled(self, on: bool) -> None:
        self.header.setArrowType(Qt.DownArrow if on else Qt.RightArrow)
        self.body.setVisible(on)
        if on:
            self._sync_body()
        self._update_header()
        self.sig_expanded.emit(on)

    def _sync_body(self) -> None:
        if self.text == self._shown:
            return
        if self._shown and self.text.startswith(self._shown):
            cursor = self.body.textCursor()
            cursor.movePosition(QTextCursor.End)
            cursor.insertText(self.text[len(self._shown) :])
        else:
            self.body.setPlainText(self.text)
        self._shown = self.text

    def _update_header(self) -> None:
        label = thinking_label(self.seconds, self.streaming, tr)
        if self.header.text() != label:
            self.header.setText(label)
        hint = tr("Hide the reasoning") if self.expanded else tr("Show the reasoning")
        if self.header.toolTip() != hint:
            self.header.setToolTip(hint)
            self.header.setAccessibleName(f"{label}. {hint}")

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self._update_header()
        super().changeEvent(event)
