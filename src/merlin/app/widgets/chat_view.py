"""The conversation: one widget per message, markdown rendered, answers streamed cheaply.

A finished message is rendered once. The answer being streamed renders its finished blocks
once each (app.markdown.stable_length) and re-renders only the unfinished tail, at most at
the rate the controller flushes (about 30 times a second); when it ends it is rendered once
more as a whole (so chunk boundaries leave no trace) and gets "Copy code" links. The view
follows new text only while the user is at the bottom.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import (
    QColor,
    QGuiApplication,
    QImage,
    QPainter,
    QPalette,
    QPixmap,
)
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from merlin.app.i18n import tr
from merlin.app.widgets import theme
from merlin.app.widgets.icons import icon
from merlin.app.widgets.message_text import MessageText
from merlin.app.widgets.reasoning_block import ReasoningBlock
from merlin.app.widgets.thumbnails import thumbnails
from merlin.app.widgets.version_switch import VersionSwitch

MAX_COLUMN_WIDTH_EM = 58  # readable line length; wider windows get margins
THUMB_HEIGHT = 120


def _show(label: QLabel, image: QImage | None, dpr: float) -> None:
    if image is None:
        label.setText(tr("[image missing]"))
        return
    pm = QPixmap.fromImage(image)
    pm.setDevicePixelRatio(dpr)
    label.setPixmap(pm)


class MessageWidget(QFrame):
    """One message: who, status, actions, image thumbnails, text.

    sig_edit_requested(int): message id; the user wants to edit this (user) message.
    sig_regenerate_requested(int): message id; the user wants this answer again.
    sig_version_requested(int, int): message id, step; show another version of it.
    """

    sig_edit_requested = Signal(int)
    sig_regenerate_requested = Signal(int)
    sig_version_requested = Signal(int, int)

    def __init__(self, message_id: int, role: str, parent=None):
        super().__init__(parent)
        self.message_id = message_id
        self.role = role
        self.text = ""
        self.state = "done"
        self.stats: dict = {}
        self.error = ""
        self.image_paths: list[str] = []
        self.reasoning: ReasoningBlock | None = None  # a thinking model's, above the answer
        self.setAttribute(Qt.WA_StyledBackground, False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(4)
        header = QHBoxLayout()
        header.setSpacing(6)
        self.who = QLabel()
        font = self.who.font()
        font.setBold(True)
        self.who.setFont(font)
        self.status = QLabel()
        self.status.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        header.addWidget(self.who)
        header.addWidget(self.status)
        header.addStretch(1)
        self.versions = VersionSwitch(self)  # "< 2/3 >", shown when there are versions
        self.versions.sig_step.connect(
            lambda step: self.sig_version_requested.emit(self.message_id, step)
        )
        header.addWidget(self.versions)
        self.copy_button = self._tool("copy", self.copy_text)
        self.edit_button = self._tool("edit", lambda: self.sig_edit_requested.emit(self.message_id))
        self.regenerate_button = self._tool(
            "regenerate", lambda: self.sig_regenerate_requested.emit(self.message_id)
        )
        for b in (self.edit_button, self.regenerate_button, self.copy_button):
            header.addWidget(b)
        self.edit_button.setVisible(role == "user")
        self.regenerate_button.setVisible(False)
        layout.addLayout(header)
        self.thumbs = QHBoxLayout()
        self.thumbs.setSpacing(6)
        self.thumbs.addStretch(1)
        self.thumb_row = QWidget()
        self.thumb_row.setLayout(self.thumbs)
        self.thumbs.setContentsMargins(0, 0, 0, 0)
        self.thumb_row.setVisible(False)
        layout.addWidget(self.thumb_row)
        self.notices = QLabel()  # engine notices about this answer (e.g. older turns left out)
        self.notices.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.notices.setObjectName("messageNotices")
        self.notices.setWordWrap(True)
        self.notices.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.notices.setVisible(False)
        layout.addWidget(self.notices)
        self.body = MessageText(self)
        layout.addWidget(self.body)
        self.note = QLabel()
        self.note.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.note.setWordWrap(True)
        self.note.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.note.setVisible(False)
        layout.addWidget(self.note)
        self.retranslate()

    def _tool(self, icon_name: str, slot) -> QToolButton:
        b = QToolButton(self)
        b.setIcon(icon(icon_name))
        b.setAutoRaise(True)
        b.setIconSize(QSize(16, 16))
        b.clicked.connect(slot)
        return b

    # ---- content -------------------------------------------------------------------------

    def set_images(self, paths: list[str], names: list[str] | None = None) -> None:
        """Thumbnails of the message's images, decoded on a worker (widgets/thumbnails.py):
        each label keeps its place, empty until its picture arrives."""
        self.image_paths = list(paths)
        dpr = self.devicePixelRatioF()
        height = round(THUMB_HEIGHT * dpr)
        for i, path in enumerate(paths):
            label = QLabel()
            label.setMinimumHeight(THUMB_HEIGHT)
            label.setToolTip(names[i] if names and i < len(names) else path)
            label.setObjectName("thumbnail")
            self.thumbs.insertWidget(self.thumbs.count() - 1, label)
            thumbnails().request(
                path, height, 3 * height, label, lambda image, label=label: _show(label, image, dpr)
            )
        self.thumb_row.setVisible(bool(paths))

    def set_text(self, text: str) -> None:
        """A finished message (rendered once)."""
        self.text = text
        if self.role == "user":
            self.body.render_plain(text)
        else:
            self.body.render_markdown(text, finished=True)

    def set_reasoning(self, text: str, seconds: float, streaming: bool) -> None:
        """A thinking model's reasoning, in a collapsed block above the answer (never part
        of self.text, so Copy leaves it out)."""
        if self.reasoning is None:
            self.reasoning = ReasoningBlock(self)
            layout = self.layout()
            layout.insertWidget(layout.indexOf(self.body), self.reasoning)
        self.reasoning.set_content(text, seconds, streaming)

    def stream(self, text: str) -> None:
        self.text = text
        self.body.stream(text)

    def finish(self, text: str, state: str, stats: dict | None = None, error: str = "") -> None:
        self.state = state
        self.stats = dict(stats or {})
        self.error = error
        self.set_notices(self.stats.get("notices") or [])
        self.set_text(text)
        drafted = self.stats.get("drafted") or []
        if self.role == "assistant" and drafted:
            self.body.mark_drafted(text, drafted)
            self.body.setToolTip(tr("Tinted text came from accepted speculative drafts."))
        self._update_status()

    def set_state(self, state: str, error: str = "") -> None:
        self.state = state
        self.error = error
        self._update_status()

    def set_notices(self, notices: list[str]) -> None:
        """A small muted line per notice, above the answer (never a popup)."""
        self.notices.setText("\n".join(notices))
        self.notices.setVisible(bool(notices))
        font = self.notices.font()
        font.setItalic(True)
        self.notices.setFont(font)
        pal = self.notices.palette()
        pal.setColor(QPalette.WindowText, theme.muted_text())
        self.notices.setPalette(pal)

    def set_versions(self, version: int, count: int) -> None:
        self.versions.set_versions(version, count)

    def set_can_regenerate(self, on: bool) -> None:
        self.regenerate_button.setVisible(on and self.role == "assistant")

    def set_actions_enabled(self, on: bool) -> None:
        self.edit_button.setEnabled(on)
        self.regenerate_button.setEnabled(on)

    def copy_text(self) -> None:
        QGuiApplication.clipboard().setText(self.text)

    # ---- looks ---------------------------------------------------------------------------

    def _update_status(self) -> None:
        parts = []
        n = self.stats.get("tokens")
        if self.role == "assistant" and n:
            parts.append(tr("{n} tokens").format(n=n))
            tps = self.stats.get("tokens_per_s")
            if tps:
                parts.append(tr("{rate:.1f} tokens/s").format(rate=tps))
        state_text = {
            "streaming": tr("writing…"),
            "stopped": tr("stopped"),
            "interrupted": tr("interrupted (Merlin was closed while answering)"),
            "error": tr("failed"),
            "queued": tr("waiting for the model to load"),
        }.get(self.state)
        if self.stats.get("reason") == "context_full":
            state_text = tr("the context budget is full")
        if state_text:
            parts.append(state_text)
        self.status.setText(" · ".join(parts))
        self.note.setVisible(bool(self.error))
        if self.error:
            self.note.setText(self.error)
            pal = self.note.palette()
            pal.setColor(QPalette.WindowText, QColor("#D0393E"))
            self.note.setPalette(pal)
        muted = theme.muted_text()
        pal = self.status.palette()
        pal.setColor(QPalette.WindowText, muted)
        self.status.setPalette(pal)

    def retranslate(self) -> None:
        self.who.setText(tr("You") if self.role == "user" else tr("Merlin"))
        self.copy_button.setToolTip(tr("Copy message"))
        self.edit_button.setToolTip(tr("Edit and run again from here"))
        self.regenerate_button.setToolTip(tr("Regenerate this answer"))
        self._update_status()

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self.retranslate()
        super().changeEvent(event)

    def paintEvent(self, event):  # noqa: N802
        if self.role == "user":
            p = QPainter(self)
            p.setRenderHint(QPainter.Antialiasing)
            p.setPen(Qt.NoPen)
            p.setBrush(theme.user_bubble())
            p.drawRoundedRect(self.rect().adjusted(0, 1, 0, -1), 10, 10)
            p.end()
        super().paintEvent(event)


class ChatView(QScrollArea):
    """The message column.

    sig_edit_requested(int): message id of a user message to edit.
    sig_regenerate_requested(int): message id of the answer to regenerate.
    sig_version_requested(int, int): message id and step (-1, +1) of a version switch.
    sig_more_above(): the reader nears the oldest message shown, and older ones wait.
    """

    sig_edit_requested = Signal(int)
    sig_regenerate_requested = Signal(int)
    sig_version_requested = Signal(int, int)
    sig_more_above = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setAcceptDrops(False)
        self.column = QWidget()
        self.column.setObjectName("chatColumn")
        self.layout_ = QVBoxLayout(self.column)
        self.layout_.setSpacing(10)
        self.layout_.addStretch(1)
        self.setWidget(self.column)
        self.empty = QLabel(self.viewport())
        self.empty.setAlignment(Qt.AlignCenter)
        self.empty.setWordWrap(True)
        self._messages: list[MessageWidget] = []
        self._stick = True
        # scrolled up: the first message in view and its offset, kept in place when the
        # column's height changes above it (older messages going in, text re-wrapping)
        self._anchor: tuple[QWidget, int] | None = None
        self._adjusting = False
        self._more_above = False  # older messages wait for the reader (sig_more_above)
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range)
        self.retranslate()
        self._update_empty()

    # ---- messages ------------------------------------------------------------------------

    def clear(self) -> None:
        for w in self._messages:
            w.setParent(None)
            w.deleteLater()
        self._messages = []
        self._stick = True
        self._anchor = None
        self._update_empty()

    def add_message(
        self,
        message_id: int,
        role: str,
        text: str,
        images: list[str] | None = None,
        image_names: list[str] | None = None,
        state: str = "done",
        stats: dict | None = None,
        error: str = "",
        at_top: bool = False,
    ) -> MessageWidget:
        """A message at the end, or at_top (an older one of the chat shown, added while the
        user reads: the part of the chat in view stays where it is, _keep_anchor)."""
        w = MessageWidget(message_id, role, self.column)
        w.sig_edit_requested.connect(self.sig_edit_requested)
        w.sig_regenerate_requested.connect(self.sig_regenerate_requested)
        w.sig_version_requested.connect(self.sig_version_requested)
        if images:
            w.set_images(images, image_names)
        if state == "streaming":
            w.set_state("streaming")
        else:
            w.finish(text, state, stats, error)
        if at_top:
            self.layout_.insertWidget(0, w)
            self._messages.insert(0, w)
        else:
            self.layout_.insertWidget(self.layout_.count() - 1, w)
            self._messages.append(w)
            self.scroll_to_bottom()
        self._update_empty()
        return w

    def _top_visible(self) -> tuple[QWidget, int] | None:
        """The first message in view and its distance below the view's top edge."""
        top = self.verticalScrollBar().value()
        for w in self._messages:
            if w.y() + w.height() > top:
                return w, w.y() - top
        return None

    def remove_from(self, message_id: int) -> None:
        """Remove the message and every later one."""
        keep = [w for w in self._messages if w.message_id < message_id]
        for w in self._messages[len(keep) :]:
            w.setParent(None)
            w.deleteLater()
        self._messages = keep
        self._update_empty()

    def messages(self) -> list[MessageWidget]:
        return list(self._messages)

    def last_message_id(self) -> int | None:
        return self._messages[-1].message_id if self._messages else None

    def message(self, message_id: int) -> MessageWidget | None:
        return next((w for w in self._messages if w.message_id == message_id), None)

    def version_target(self) -> MessageWidget | None:
        """The message a version shortcut (Alt+Left/Right) switches: the one holding the
        keyboard focus when it has versions, else the last message shown that has versions."""
        focus = QApplication.focusWidget()
        with_versions = [w for w in self._messages if w.versions.count > 1]
        held = [w for w in with_versions if focus is not None and w.isAncestorOf(focus)]
        return (held or with_versions or [None])[-1]

    def step_version(self, step: int) -> bool:
        """Ask for the previous (-1) or next (+1) version of version_target(), as its
        switch's buttons do (an answer that streams is stopped first: model/branching.py)."""
        w = self.version_target()
        if w is None:
            return False
        self.sig_version_requested.emit(w.message_id, step)
        return True

    def update_actions(self, busy: bool) -> None:
        """Regenerate on every answer (an earlier one branches there: model/branching.py);
        nothing editable while an answer streams."""
        for w in self._messages:
            w.set_can_regenerate(w.role == "assistant")
            w.set_actions_enabled(not busy)

    def plain_text(self) -> str:
        return "\n\n".join(f"{w.who.text()}\n{w.text}" for w in self._messages)

    # ---- following the end -----------------------------------------------------------------

    @property
    def at_bottom(self) -> bool:
        return self._stick

    def scroll_to_bottom(self) -> None:
        self._stick = True
        QTimer.singleShot(
            0, lambda: self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())
        )

    def set_more_above(self, more: bool) -> None:
        """Whether older messages wait above; sig_more_above asks for them once the reader
        is within a screen of the top (and again after each batch, while still there)."""
        self._more_above = more
        if more:
            QTimer.singleShot(0, self, self._ask_for_more)

    def _ask_for_more(self) -> None:
        bar = self.verticalScrollBar()
        if self._more_above and bar.value() <= self.viewport().height():
            self._more_above = False  # until the model says there are more
            self.sig_more_above.emit()

    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._stick = value >= bar.maximum() - 4
        if not self._adjusting:
            self._anchor = None if self._stick else self._top_visible()
        if self._more_above:
            self._ask_for_more()

    def _on_range(self, _min: int, maximum: int) -> None:
        if self._stick:
            self.verticalScrollBar().setValue(maximum)
        elif self._anchor is not None:  # once the layout has placed the messages
            QTimer.singleShot(0, self, self._keep_anchor)

    def _keep_anchor(self) -> None:
        if self._stick or self._anchor is None:
            return
        w, offset = self._anchor
        if w not in self._messages:
            self._anchor = None
            return
        self._adjusting = True
        try:
            self.verticalScrollBar().setValue(w.y() - offset)
        finally:
            self._adjusting = False

    # ---- layout --------------------------------------------------------------------------

    def resizeEvent(self, event):  # noqa: N802
        super().resizeEvent(event)
        em = self.fontMetrics().horizontalAdvance("M")
        side = max(12, (self.viewport().width() - MAX_COLUMN_WIDTH_EM * em) // 2)
        self.layout_.setContentsMargins(side, 12, side, 12)
        self.empty.setGeometry(self.viewport().rect().adjusted(40, 0, -40, 0))

    def _update_empty(self) -> None:
        self.empty.setVisible(not self._messages)

    def retranslate(self) -> None:
        self.empty.setText(
            tr("Drop an image here or type a question below.\nMerlin answers on this computer.")
        )
        pal = self.empty.palette()
        pal.setColor(QPalette.WindowText, theme.muted_text())
        self.empty.setPalette(pal)

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self.retranslate()
        super().changeEvent(event)
