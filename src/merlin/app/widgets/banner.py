"""A strip above the chat for what the user must know now: loading progress with Cancel, the
demo model's random answers, a failed load or generation. Text is selectable; never modal."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtGui import QPainter, QPen
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QToolButton

from merlin.app.i18n import tr
from merlin.app.widgets import theme
from merlin.app.widgets.icons import icon


class Banner(QFrame):
    """sig_action(): the action button was pressed. sig_closed(): the user dismissed it."""

    sig_action = Signal()
    sig_closed = Signal()

    def __init__(self, kind: str = "info", parent=None):
        super().__init__(parent)
        self.kind = kind
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 6, 6, 6)
        layout.setSpacing(8)
        self.label = QLabel()
        self.label.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setMaximumWidth(220)
        self.progress.setVisible(False)
        self.action = QPushButton()
        self.action.setVisible(False)
        self.action.clicked.connect(self.sig_action)
        self.close_button = QToolButton()
        self.close_button.setIcon(icon("close"))
        self.close_button.setIconSize(QSize(14, 14))
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self._close)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.action)
        layout.addWidget(self.close_button, 0, Qt.AlignTop)
        self.setVisible(False)
        self.retranslate()

    def retranslate(self) -> None:
        # an icon alone: named for the tooltip and for screen readers
        self.close_button.setToolTip(tr("Dismiss"))
        self.close_button.setAccessibleName(tr("Dismiss"))

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self.retranslate()
        super().changeEvent(event)

    def show_message(self, kind: str, text: str, action: str = "", closable: bool = True) -> None:
        self.kind = kind
        self.label.setText(text)
        self.progress.setVisible(False)
        self.action.setText(action)
        self.action.setVisible(bool(action))
        self.close_button.setVisible(closable)
        self.setVisible(True)
        self.update()

    def show_progress(self, text: str, fraction: float | None, action: str = "") -> None:
        self.kind = "info"
        self.label.setText(text)
        self.progress.setVisible(True)
        if fraction is None:
            self.progress.setRange(0, 0)  # busy indicator
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(round(max(0.0, min(1.0, fraction)) * 1000))
        self.action.setText(action)
        self.action.setVisible(bool(action))
        self.close_button.setVisible(False)
        self.setVisible(True)
        self.update()

    def text(self) -> str:
        return self.label.text()

    def _close(self) -> None:
        self.setVisible(False)
        self.sig_closed.emit()

    def paintEvent(self, event):  # noqa: N802
        bg, border = theme.banner_colors(self.kind)
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        p.setPen(QPen(border, 1))
        p.setBrush(bg)
        p.drawRoundedRect(self.rect().adjusted(1, 1, -1, -1), 6, 6)
        p.end()
        super().paintEvent(event)
