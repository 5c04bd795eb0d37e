"""One message's text: markdown rendered as text, streamed by blocks, code blocks copyable.

A finished message is rendered once (render_markdown). While an answer streams, stream()
renders its finished blocks once each (app.markdown.stable_length) and re-renders only the
unfinished tail; raw HTML in model text is shown as written, never interpreted. The widget
sizes itself to its document (the chat view scrolls, not this widget).

The tail can be long (a code block still open is re-rendered whole, 20+ ms at 20 KB here and
several times that on a board's core), so a streamed text is shown at most once every
STREAM_SPACING times the last render's duration: rendering takes at most about a quarter of
the GUI thread's time whatever the answer, and a text held back is shown by a timer.

A text with a run of LONG_RUN characters and no space (a pasted base64 blob, minified JSON, a
long URL) wraps anywhere: Qt's word wrap looks through the whole run for a boundary at every
line, which is quadratic (100,000 such characters froze the window 9 s at each send, opening
and resize; anywhere: a few ms). Other texts keep wrapping at word boundaries.
"""

import math
import re
import time
from contextlib import contextmanager

from PySide6.QtCore import QSize, Qt, QTimer, QUrl
from PySide6.QtGui import (
    QDesktopServices,
    QGuiApplication,
    QPalette,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextOption,
)
from PySide6.QtWidgets import (
    QFrame,
    QSizePolicy,
    QTextBrowser,
)

from merlin.app.i18n import tr
from merlin.app.model import markdown
from merlin.app.widgets import highlight, theme

COPY_SCHEME = "merlin-copy"
STREAM_SPACING = 4.0  # a streamed render starts at least this many of its durations apart
LONG_RUN = 2000  # characters without a space: such a text wraps anywhere (module docstring)
# a character of such a run: not a space, nor CJK (which breaks between its characters); the
# look-behind starts each match at a run's start, so the search is linear in the text
_RUN_CHAR = r"[^\s\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"
_LONG_RUN = re.compile(rf"(?<!{_RUN_CHAR}){_RUN_CHAR}{{{LONG_RUN}}}")


# Model text is text: raw HTML in an answer (`</think>`, "use the <b> tag") is shown as written,
# never interpreted (Qt's importer passes HTML through by default and hides what follows a tag).
MARKDOWN_FEATURES = QTextDocument.MarkdownFeatures(
    QTextDocument.MarkdownDialectGitHub | QTextDocument.MarkdownNoHTML
)


class MessageText(QTextBrowser):
    """Rendered markdown of one message; as tall as its text (the chat view scrolls)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setOpenLinks(False)
        self.setAcceptDrops(False)
        self.setTextInteractionFlags(
            Qt.TextSelectableByMouse | Qt.TextSelectableByKeyboard | Qt.LinksAccessibleByMouse
        )
        self.viewport().setAutoFillBackground(False)
        pal = self.palette()  # transparent through the palette: a style sheet would stop the
        pal.setColor(QPalette.Base, Qt.transparent)  # app font (demo mode) reaching the text
        self.setPalette(pal)
        self.document().setDocumentMargin(2)
        self.document().setUndoRedoEnabled(False)  # read-only; streaming must not pile up undo
        self.code_texts: list[str] = []
        self.anchorClicked.connect(self.on_anchor_clicked)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        # streaming state: source offset rendered as finished blocks, and where the tail starts
        self._stable_src = 0
        self._tail_pos = 0
        self._fit_paused = False
        # a streamed text waiting for its turn (STREAM_SPACING), and the last render's timing
        self._waiting_src: str | None = None
        self._render_s = 0.0
        self._rendered_at = 0.0
        self._stream_timer = QTimer(self, singleShot=True)
        self._stream_timer.timeout.connect(self.show_streamed)

    @contextmanager
    def _one_layout(self):
        """Formatting as one edit of the document: laid out and fitted once, at the end. Each
        change otherwise re-laid out the whole message and refitted the widget (a syntax
        token, an inline code span, a tinted draft, a copy link: a 200-line code answer took
        10 s to finish on the GUI thread)."""
        cursor = QTextCursor(self.document())
        self._fit_paused = True
        cursor.beginEditBlock()
        try:
            yield
        finally:
            cursor.endEditBlock()
            self._fit_paused = False
            self._fit()

    # ---- rendering -----------------------------------------------------------------------

    def render_markdown(self, src: str, finished: bool = True) -> None:
        """Render the whole text (a finished message, or the final render of an answer)."""
        self._drop_waiting()
        self._wrap_for(src)
        self.document().setMarkdown(markdown.prepare(src), MARKDOWN_FEATURES)
        with self._one_layout():
            groups = highlight.decorate(self.document())
            self.code_texts = []
            if finished:
                self._add_copy_links(groups)
        self._stable_src = len(src)
        self._tail_pos = self._end()

    def mark_drafted(self, src: str, spans: list) -> int:
        """Tint the text of `src[start:end]` for each (start, end) span: what a speculative
        verify step emitted with accepted drafts. Source offsets are found again in the
        rendered document in order (markdown changes positions); a piece markdown rewrote is
        left plain. Returns the pieces tinted."""
        doc = self.document()
        fmt = QTextCharFormat()
        fmt.setBackground(theme.drafted_background())
        pos, marked = 0, 0
        with self._one_layout():
            for start, end in spans:
                for piece in src[start:end].split("\n"):
                    piece = piece.strip()
                    if not piece:
                        continue
                    found = doc.find(piece, pos, QTextDocument.FindCaseSensitively)
                    if found.isNull():
                        continue
                    found.mergeCharFormat(fmt)
                    pos = found.selectionEnd()
                    marked += 1
        return marked

    def render_plain(self, text: str) -> None:
        """User messages are shown as typed (no markdown surprises), still selectable."""
        self._drop_waiting()
        self._wrap_for(text)
        self.document().setPlainText(text)
        self._fit()

    def stream(self, src: str) -> None:
        """Show a growing answer: finished blocks once, the tail again each time; at once,
        or, within STREAM_SPACING renders' time of the last one, when the timer fires (the
        newest text then)."""
        self._waiting_src = src
        if self._stream_timer.isActive():
            return
        due = self._rendered_at + STREAM_SPACING * self._render_s - time.perf_counter()
        if due > 0:
            self._stream_timer.start(max(1, math.ceil(due * 1000)))
        else:
            self.show_streamed()

    def show_streamed(self) -> None:
        """Render the streamed text held back, if any, now."""
        self._stream_timer.stop()
        src, self._waiting_src = self._waiting_src, None
        if src is None:
            return
        t0 = time.perf_counter()
        self._render_stream(src)
        self._rendered_at = time.perf_counter()
        self._render_s = self._rendered_at - t0

    def _drop_waiting(self) -> None:
        self._stream_timer.stop()
        self._waiting_src = None

    def _render_stream(self, src: str) -> None:
        self._wrap_for(src)
        doc = self.document()
        cursor = QTextCursor(doc)
        stable = markdown.stable_length(src)
        cursor.beginEditBlock()
        # drop the old tail
        cursor.setPosition(self._tail_pos)
        cursor.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
        cursor.removeSelectedText()
        if stable > self._stable_src:
            start = self._insert(cursor, src[self._stable_src : stable])
            cursor.endEditBlock()
            with self._one_layout():
                highlight.decorate(doc, start)
            cursor.beginEditBlock()
            self._stable_src = stable
            self._tail_pos = self._end()
        tail = src[self._stable_src :]
        if tail.strip():
            cursor.setPosition(self._tail_pos)
            self._insert(cursor, tail)
        cursor.endEditBlock()

    def _insert(self, cursor: QTextCursor, src: str) -> int:
        """Insert markdown at the end as new blocks; returns where it starts."""
        cursor.movePosition(QTextCursor.End)
        if self._end() > 0:
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        start = cursor.position()
        cursor.insertMarkdown(markdown.prepare(src), MARKDOWN_FEATURES)
        return start

    def _wrap_for(self, text: str) -> None:
        """Wrap anywhere if `text` has a run of LONG_RUN characters without a space, else at
        word boundaries (a long word still breaks)."""
        long_run = _LONG_RUN.search(text) is not None
        mode = QTextOption.WrapAnywhere if long_run else QTextOption.WrapAtWordBoundaryOrAnywhere
        if self.wordWrapMode() != mode:
            self.setWordWrapMode(mode)

    def _end(self) -> int:
        return max(0, self.document().characterCount() - 1)

    def _add_copy_links(self, groups: list[tuple[int, int]]) -> None:
        doc = self.document()
        self.code_texts = []
        texts = []
        for first_pos, last_pos in groups:
            first, last = doc.findBlock(first_pos), doc.findBlock(last_pos)
            c = QTextCursor(doc)
            c.setPosition(first.position())
            c.setPosition(last.position() + last.length() - 1, QTextCursor.KeepAnchor)
            texts.append(c.selectedText().replace("\u2029", "\n"))
        self.code_texts = texts
        for index in range(len(groups) - 1, -1, -1):
            last = doc.findBlock(groups[index][1])
            c = QTextCursor(last)
            c.movePosition(QTextCursor.EndOfBlock)
            fmt = QTextBlockFormat()
            fmt.setAlignment(Qt.AlignRight)
            fmt.setBottomMargin(6)
            c.insertBlock(fmt, QTextCharFormat())
            c.insertHtml(f'<a href="{COPY_SCHEME}:{index}">{tr("Copy code")}</a>')

    # ---- sizing --------------------------------------------------------------------------

    def _fit(self, *_):
        if self._fit_paused:
            return
        doc = self.document()
        doc.setTextWidth(self.viewport().width())
        margins = self.contentsMargins()
        h = math.ceil(doc.size().height()) + margins.top() + margins.bottom() + 2
        if self.height() != h:
            self.setFixedHeight(h)

    def resizeEvent(self, event):  # noqa: N802 (Qt name)
        super().resizeEvent(event)
        self._fit()

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(400, self.height())

    def wheelEvent(self, event):  # noqa: N802 - the chat view scrolls, not this widget
        event.ignore()

    # ---- copying -------------------------------------------------------------------------

    def on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() == COPY_SCHEME:
            index = int(url.path() or -1)
            if 0 <= index < len(self.code_texts):
                QGuiApplication.clipboard().setText(self.code_texts[index])
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)

    def code_block_at(self, pos) -> str | None:
        block = self.cursorForPosition(pos).block()
        if not highlight.is_code_block(block):
            return None
        first = last = block
        while first.previous().isValid() and highlight.is_code_block(first.previous()):
            first = first.previous()
        while last.next().isValid() and highlight.is_code_block(last.next()):
            last = last.next()
        c = QTextCursor(self.document())
        c.setPosition(first.position())
        c.setPosition(last.position() + last.length() - 1, QTextCursor.KeepAnchor)
        return c.selectedText().replace("\u2029", "\n")

    def contextMenuEvent(self, event):  # noqa: N802
        menu = self.createStandardContextMenu(event.pos())
        code = self.code_block_at(event.pos())
        if code is not None:
            menu.addSeparator()
            action = menu.addAction(tr("Copy code block"))
            action.triggered.connect(lambda: QGuiApplication.clipboard().setText(code))
        menu.exec(event.globalPos())
