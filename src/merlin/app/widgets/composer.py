"""Where the user writes: multi-line text, image attachments, send / stop.

Enter sends, Shift+Enter starts a new line, and an Enter that confirms an input-method
candidate (pinyin) only confirms it. Images come by the attach button, by drag-and-drop
(anywhere on the window; the window forwards drops here) and by pasting. Nothing typed is
dropped: the text leaves the composer only when the controller accepted the message.

Attached files are read and thumbnailed on a worker thread (widgets/background.py), and
copied into the chat store there too (store_file, set by the controller: sending then needs no
copy on the GUI thread); their chips appear in the order given once read; a message sent
meanwhile goes when they are.

Each attached image shows its cost: "N tokens, about S s to read" (from the engine: the image
is encoded as soon as it is attached, app/image_encoding.py), then "read in S s", and a
detail menu (fast / detailed / full, or the settings' default) that changes its budget.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote_to_bytes

from PySide6.QtCore import QEvent, QMimeData, QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QFontMetrics,
    QImage,
    QKeyEvent,
    QKeySequence,
    QPalette,
    QShortcut,
    QTextLayout,
)
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from merlin.app.i18n import tr
from merlin.app.widgets import theme
from merlin.app.widgets.attachments import (
    Attachment,
    AttachmentError,
    ReadImage,
    read_image,
    save_pasted_image,
    to_attachment,
)
from merlin.app.widgets.background import BackgroundJob
from merlin.app.widgets.icons import icon

MAX_IMAGES = 8
# clipboard formats that carry an image file's bytes, attached as they are and decoded on
# the worker (first found wins); pixels only (application/x-qt-image) are decoded by Qt
PASTED_FORMATS = (("image/png", "png"), ("image/jpeg", "jpg"), ("image/webp", "webp"),
                  ("image/gif", "gif"), ("image/bmp", "bmp"), ("image/x-bmp", "bmp"),
                  ("image/tiff", "tif"))  # fmt: skip
MAX_LINES = 8


class ComposerEdit(QPlainTextEdit):
    """The text field.

    sig_submit(): Enter was pressed (not during input-method composition).
    sig_escape(): Escape was pressed.
    sig_mime_pasted(object): a paste or drop of images/files (QMimeData).
    """

    sig_submit = Signal()
    sig_escape = Signal()
    sig_mime_pasted = Signal(object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._preedit = ""
        self.setTabChangesFocus(True)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self._fit()

    @property
    def composing(self) -> bool:
        return bool(self._preedit)

    def inputMethodEvent(self, event):  # noqa: N802 (Qt name)
        self._preedit = event.preeditString()
        super().inputMethodEvent(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        if event.key() in (Qt.Key_Return, Qt.Key_Enter):
            if self.composing:  # the input method's Enter confirms its candidate, nothing else
                event.accept()
                return
            if event.modifiers() & Qt.ShiftModifier:
                self.textCursor().insertText("\n")
                return
            if not event.modifiers() & (Qt.ControlModifier | Qt.AltModifier | Qt.MetaModifier):
                self.sig_submit.emit()
                return
        if event.key() == Qt.Key_Escape:
            self.sig_escape.emit()
            return
        super().keyPressEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802
        return source.hasImage() or source.hasUrls() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802
        if source.hasImage() or (source.hasUrls() and any(u.isLocalFile() for u in source.urls())):
            self.sig_mime_pasted.emit(source)
            return
        super().insertFromMimeData(source)

    def _fit(self, *_):
        lines = max(1, min(MAX_LINES, round(self.document().size().height())))
        line_h = _line_height(self.font())
        margins = self.contentsMargins()
        h = lines * line_h + 2 * self.document().documentMargin() + margins.top() + margins.bottom()
        self.setFixedHeight(int(h) + 2)

    def changeEvent(self, event):  # noqa: N802
        super().changeEvent(event)
        if event.type() == QEvent.FontChange:
            self._fit()


def _local_path(url: QUrl) -> str:
    """A file: URL's path with the name's own bytes (os.fsdecode): QUrl.toLocalFile reads
    them as UTF-8, so a name that is not ("bad%FFname.png") became one no file has."""
    if url.host() not in ("", "localhost"):
        return url.toLocalFile()  # a network share's //host/path, as Qt names it
    return os.fsdecode(unquote_to_bytes(url.path(QUrl.FullyEncoded)))


def _with_detail(read: ReadImage, detail: str) -> ReadImage:
    read.detail = detail if detail in DETAIL_NAMES else ""
    return read


def _followed_by(draft: str, rewrite: str) -> str:
    """A draft with an unsent rewrite after it (either may be empty)."""
    return f"{draft}\n\n{rewrite}" if draft.strip() and rewrite else rewrite or draft


def _line_height(font) -> int:
    """A line's height in this font with its fallbacks: Chinese glyphs come from a taller
    font (Noto Sans CJK) than Latin ones, and one line of them must not need a scroll bar."""
    layout = QTextLayout("Ag你", font)
    layout.beginLayout()
    line = layout.createLine()
    layout.endLayout()
    return max(QFontMetrics(font).lineSpacing(), math.ceil(line.height()))


@dataclass
class _Reading:
    """Files being read for the composer: one worker job, the contents generation it was
    started for (a later clear or edit drops its result), its outcomes once delivered, and
    the files as (path, name, detail) where known (a paste's are made on the worker)."""

    generation: int
    count: int
    job: BackgroundJob | None = None
    outcomes: list | None = None
    sources: list[tuple[str, str, str]] = field(default_factory=list)


DETAIL_NAMES = {"": "default", "fast": "fast", "detailed": "detailed", "full": "full"}


class AttachmentChip(QFrame):
    """A thumbnail with a remove button, the image's cost and its detail menu.

    sig_remove(object): the Attachment to remove.
    sig_detail(object, str): the Attachment and the detail chosen ("" = the default).
    """

    sig_remove = Signal(object)
    sig_detail = Signal(object, str)

    def __init__(self, attachment: Attachment, parent=None):
        super().__init__(parent)
        self.attachment = attachment
        self.setFrameShape(QFrame.StyledPanel)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(3, 3, 3, 3)
        layout.setSpacing(2)
        thumb = QLabel()
        pm = attachment.thumbnail
        if pm.height() > 56:
            pm = pm.scaledToHeight(56, Qt.SmoothTransformation)
        thumb.setPixmap(pm)
        thumb.setToolTip(attachment.name)
        layout.addWidget(thumb)
        column = QVBoxLayout()
        column.setSpacing(0)
        self.status = QLabel()
        self.status.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        pal = self.status.palette()
        pal.setColor(QPalette.WindowText, theme.muted_text())
        self.status.setPalette(pal)
        self.detail_button = QToolButton()
        self.detail_button.setAutoRaise(True)
        self.detail_button.setPopupMode(QToolButton.InstantPopup)
        self.detail_menu = QMenu(self.detail_button)
        for key in DETAIL_NAMES:
            action = self.detail_menu.addAction("")
            action.setData(key)
            action.setCheckable(True)
            action.triggered.connect(lambda _=False, k=key: self.choose_detail(k))
        self.detail_button.setMenu(self.detail_menu)
        column.addWidget(self.status)
        column.addWidget(self.detail_button)
        layout.addLayout(column)
        self.remove = QToolButton()
        self.remove.setIcon(icon("close"))
        self.remove.setAutoRaise(True)
        self.remove.setIconSize(QSize(12, 12))
        self.remove.setToolTip(tr("Remove {name}").format(name=attachment.name))
        self.remove.clicked.connect(lambda: self.sig_remove.emit(self.attachment))
        layout.addWidget(self.remove, 0, Qt.AlignTop)
        self.presets: dict[str, int] = {}
        self.retranslate()

    @property
    def detail(self) -> str:
        """The detail chosen ("" = the default); kept on the attachment, which outlives the
        chip when an edit puts the draft aside."""
        return self.attachment.detail

    def choose_detail(self, key: str) -> None:
        if key != self.detail:
            self.attachment.detail = key
            self.retranslate()
            self.sig_detail.emit(self.attachment, key)

    def set_status(self, text: str) -> None:
        self.status.setText(text)

    def retranslate(self) -> None:
        names = {"": tr("default"), "fast": tr("fast"), "detailed": tr("detailed"),
                 "full": tr("full")}  # fmt: skip
        for action in self.detail_menu.actions():
            key = action.data()
            n = self.presets.get(key)
            action.setText(f"{names[key]} ({n})" if n else names[key])
            action.setChecked(key == self.detail)
        self.detail_button.setText(tr("detail: {name}").format(name=names[self.detail]))
        self.detail_button.setToolTip(tr("How many image tokens this picture may become"))


class Composer(QWidget):
    """sig_send(str, list): the user sent text with attachments (the controller decides).
    sig_stop(): the user asked to stop the answer.
    sig_edit_cancelled(): the user left edit mode.
    """

    sig_send = Signal(str, list)
    sig_stop = Signal()
    sig_edit_cancelled = Signal()
    sig_attached = Signal(object)  # an Attachment was added (encode it now)
    sig_detached = Signal(object)  # the user removed it (stop encoding it)
    sig_detail = Signal(object)  # its detail changed (encode it again at that budget)
    sig_contents_changed = Signal()  # text, pictures or a detail changed (the draft on disk)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._attachments: list[Attachment] = []
        self._presets: dict[str, int] = {}
        self._busy = False
        self._editing = False
        self._saved_draft: tuple[str, list[Attachment]] | None = None
        # the edited message's text and picture paths as the edit began
        self._edit_original: tuple[str, set[str]] = ("", set())
        self._saved_generation: int | None = None  # the put-aside draft's files being read
        self._draft_problems: list[str] = []  # and what went wrong reading them
        self._readings: list[_Reading] = []
        self._generation = 0  # bumped when the contents are replaced: older reads are dropped
        self._send_when_read = False
        self._read_problems: list[str] = []  # shown once every reading is over
        # (path, name) -> the image's copy in the chat store; run on the reading worker
        self.store_file: Callable[[str, str], object] | None = None
        outer = QVBoxLayout(self)
        outer.setContentsMargins(8, 4, 8, 8)
        outer.setSpacing(4)

        self.edit_bar = QFrame()
        self.edit_bar.setObjectName("editBar")
        eb = QHBoxLayout(self.edit_bar)
        eb.setContentsMargins(8, 2, 2, 2)
        self.edit_label = QLabel()
        self.edit_label.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.edit_cancel = QPushButton()
        self.edit_cancel.clicked.connect(self.cancel_edit)
        eb.addWidget(self.edit_label, 1)
        eb.addWidget(self.edit_cancel)
        self.edit_bar.setVisible(False)
        outer.addWidget(self.edit_bar)

        self.chips = QHBoxLayout()
        self.chips.setSpacing(6)
        self.chips.addStretch(1)
        self.chip_row = QWidget()
        self.chip_row.setLayout(self.chips)
        self.chips.setContentsMargins(0, 0, 0, 0)
        self.chip_row.setVisible(False)
        outer.addWidget(self.chip_row)

        self.notice = QLabel()

        self.notice.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.notice.setWordWrap(True)
        self.notice.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.notice.setVisible(False)
        pal = self.notice.palette()
        pal.setColor(QPalette.WindowText, theme.banner_colors("error")[1])
        self.notice.setPalette(pal)
        outer.addWidget(self.notice)

        row = QHBoxLayout()
        row.setSpacing(6)
        self.attach_button = QToolButton()
        self.attach_button.setIcon(icon("attach"))
        self.attach_button.setIconSize(QSize(22, 22))
        self.attach_button.clicked.connect(self.choose_files)
        self.edit = ComposerEdit()
        self.edit.sig_submit.connect(self.submit)
        self.edit.sig_escape.connect(self._on_escape)
        # while an answer streams, Esc stops it wherever the focus is in the window (the
        # conversation, the list, a button), as the hint says; otherwise Esc is the
        # focused widget's own (the message box cancels an edit)
        self.stop_shortcut = QShortcut(QKeySequence(Qt.Key_Escape), self)
        self.stop_shortcut.setContext(Qt.WindowShortcut)
        self.stop_shortcut.setEnabled(False)
        self.stop_shortcut.activated.connect(self.sig_stop)
        self.edit.sig_mime_pasted.connect(self.add_mime)
        self.edit.textChanged.connect(self.sig_contents_changed)
        self.send_button = QPushButton()
        self.send_button.setIconSize(QSize(20, 20))
        self.send_button.clicked.connect(self._on_send_button)
        row.addWidget(self.attach_button, 0, Qt.AlignBottom)
        row.addWidget(self.edit, 1)
        row.addWidget(self.send_button, 0, Qt.AlignBottom)
        outer.addLayout(row)
        self.hint = QLabel()
        pal = self.hint.palette()
        pal.setColor(QPalette.WindowText, theme.muted_text())
        self.hint.setPalette(pal)
        foot = QHBoxLayout()
        foot.addWidget(self.hint, 1)
        self.meter = QLabel()  # the context meter (app/context_meter.py fills it)
        self.meter.setVisible(False)
        foot.addWidget(self.meter, 0, Qt.AlignRight)
        outer.addLayout(foot)
        self._notice_timer = QTimer(self, singleShot=True, interval=12_000)
        self._notice_timer.timeout.connect(lambda: self.notice.setVisible(False))
        self.retranslate()

    # ---- text ----------------------------------------------------------------------------

    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)
        self.edit.moveCursor(self.edit.textCursor().MoveOperation.End)

    def draft(self) -> tuple[str, list[Attachment], list[tuple[str, str, str]]]:
        """What the user wrote and has not sent: while an earlier message is edited, what was
        put aside for it, with the edit's text after it once it differs from the message and
        the pictures added to the edit (closing the window mid-edit had lost them), else the
        box's text and pictures; and the files still being read for it as (path, name,
        detail)."""
        if self._editing and self._saved_draft is not None:
            text, attachments = self._saved_draft
            pending = self._pending_sources(self._saved_generation)
            rewrite, added = self._rewrite()  # the rewrite is kept too
            pending = pending + self._pending_sources(self._generation)  # the edit's own
            return _followed_by(text, rewrite), [*attachments, *added], pending
        return self.text(), self.attachments(), self._pending_sources(self._generation)

    def _rewrite(self) -> tuple[str, list[Attachment]]:
        """While editing: the box's text if it differs from the message's ("" if not), and
        the pictures added to the edit."""
        edited, (original, had) = self.text(), self._edit_original
        rewrite = edited if edited.strip() and edited != original else ""
        return rewrite, [a for a in self.attachments() if a.path not in had]

    def _pending_sources(self, generation: int | None) -> list[tuple[str, str, str]]:
        return [s for r in self._readings if r.generation == generation for s in r.sources]

    def restore_draft(self, text: str, images: list[tuple[str, str, str]]) -> None:
        """Put a draft kept on disk back: the text, and pictures as (path, name, detail),
        read on the worker like any attached file (one that is gone is reported inline)."""
        self.set_text(text)
        images = images[:MAX_IMAGES]
        reads = [lambda p=p, n=n, d=d: _with_detail(read_image(p, n), d) for p, n, d in images]
        if reads:
            self._read(reads, images)

    def attachments(self) -> list[Attachment]:
        return list(self._attachments)

    def clear(self) -> None:
        self.drop_readings()
        self.edit.clear()
        for a in list(self._attachments):
            self.remove_attachment(a)
        self.show_notice("")

    def submit(self) -> None:
        if self._busy:
            self.show_notice(tr("Merlin is still answering; press Stop or wait."), error=False)
            return
        if self._reading():
            self._send_when_read = True
            self.edit.setReadOnly(True)  # what is sent is what was there at Enter
            self.show_notice(tr("Sending once the images are read…"), error=False)
            return
        text = self.text()
        if not text.strip() and not self._attachments:
            return
        self.sig_send.emit(text, self.attachments())

    def _on_send_button(self) -> None:
        if self._busy:
            self.sig_stop.emit()
        else:
            self.submit()

    def _on_escape(self) -> None:
        if self._busy:
            self.sig_stop.emit()
        elif self._editing:
            self.cancel_edit()

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.stop_shortcut.setEnabled(busy)
        self.send_button.setIcon(icon("stop" if busy else "send"))
        self.send_button.setText(tr("Stop") if busy else tr("Send"))
        self.send_button.setToolTip(tr("Stop the answer (Esc)") if busy else tr("Send (Enter)"))

    @property
    def busy(self) -> bool:
        return self._busy

    # ---- editing an earlier message ------------------------------------------------------

    def begin_edit(self, text: str, attachments: list[Attachment]) -> None:
        if not self._editing:
            # the draft is put aside with every image it was given: files still being read
            # for it join it when they are (never waited for here: a hung file would freeze
            # the window); a send waiting for them is called off (it would go as the edit)
            self._send_when_read = False
            self._saved_draft = (self.text(), self.attachments())
            self._saved_generation = self._generation
            self._draft_problems, self._read_problems = self._read_problems, []
        self._editing = True
        self._edit_original = (text, {a.path for a in attachments})
        self._replace_contents(text, attachments)
        self.edit_bar.setVisible(True)
        self.edit.setFocus()

    def end_edit(self, restore_draft: bool) -> None:
        if not self._editing:
            return
        self._editing = False
        self.edit_bar.setVisible(False)
        draft, generation = self._saved_draft, self._saved_generation
        problems, self._draft_problems = self._draft_problems, []
        self._saved_draft = self._saved_generation = None
        if restore_draft and draft is not None:
            self._replace_contents(*draft)
            for reading in self._readings:  # the draft's files still being read come with it
                if reading.generation == generation:
                    reading.generation = self._generation
            self._read_problems = problems
            self._attach_read()  # reported with the draft's files, or now if none is left

    def cancel_edit(self) -> None:
        self.end_edit(restore_draft=True)
        self.sig_edit_cancelled.emit()

    def leave_edit(self) -> None:
        """The edit ends neither sent nor cancelled (another chat opened, the message left
        the view): the draft comes back with the rewrite after it and the pictures added to
        the edit, as draft() keeps them when the window closes (they had been dropped)."""
        if not self._editing:
            return
        rewrite, added = self._rewrite()
        for reading in self._readings:  # pictures still being read for the edit come along
            if reading.generation == self._generation:  # with the draft's (end_edit)
                reading.generation = self._saved_generation
        self.end_edit(restore_draft=True)
        if rewrite:
            self.set_text(_followed_by(self.text(), rewrite))
        for a in added:
            if len(self._attachments) < MAX_IMAGES:
                self._add_attachment(a)

    @property
    def editing(self) -> bool:
        return self._editing

    def _replace_contents(self, text: str, attachments: list[Attachment]) -> None:
        self.drop_readings()
        for a in list(self._attachments):
            self.remove_attachment(a)
        self.set_text(text)
        for a in attachments:
            self._add_attachment(a)

    # ---- attachments ---------------------------------------------------------------------

    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self,
            tr("Attach images"),
            "",
            tr("Images")
            + " (*.png *.jpg *.jpeg *.webp *.gif *.bmp *.tif *.tiff);;"
            + tr("All files")
            + " (*)",
        )
        self.add_paths(paths)

    def add_paths(
        self, paths: list[str], names: list[str] | None = None, details: list[str] | None = None
    ) -> int:
        """Attach files (names: what the user sees, default the file names; details: each
        one's detail, default the settings'), read on a worker thread; unusable ones are
        reported inline once read. Returns how many are read."""
        details = details or [""] * len(paths)
        files = list(zip(paths, names or [None] * len(paths), strict=True))
        if not files:
            return 0
        room = max(0, MAX_IMAGES - len(self._attachments) - self._reading())
        if len(files) > room:
            files = files[:room]
            too_many = tr("At most {n} images per message.").format(n=MAX_IMAGES)
            if not files:
                self.show_notice(too_many)
                return 0
            self._read_problems.append(too_many)
        sources = [(str(p), n or Path(p).name, d) for (p, n), d in zip(files, details)]
        self._read(
            [lambda p=p, n=n, d=d: _with_detail(read_image(p, n), d) for p, n, d in sources],
            sources,
        )
        return len(files)

    def add_image(self, image: QImage | bytes, name: str | None = None, ext: str = "png") -> bool:
        """Attach a pasted image: a QImage, or an image file's bytes (`ext`: PASTED_FORMATS),
        which are decoded on the worker, not here."""
        empty = not image if isinstance(image, bytes) else image.isNull()
        if empty:
            self.show_notice(tr("The clipboard image is empty."))
            return False
        if len(self._attachments) + self._reading() >= MAX_IMAGES:
            self.show_notice(tr("At most {n} images per message.").format(n=MAX_IMAGES))
            return False
        name = name or tr("pasted image")
        self._read([lambda: read_image(save_pasted_image(image, ext), name)])
        return True

    def wait_attachments(self, timeout: float | None = None) -> bool:
        """Block until every file being read is attached (a window closing, scripted modes,
        tests), or `timeout` seconds passed; whether none is left being read."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._readings:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._readings[0].job.wait(left)  # its delivery removes it (and any after it)
        return True

    def close_reading(self, timeout: float) -> bool:
        """The window is closing: a send waiting for files is called off (it would start an
        answer that closing stops at once) and files being read are waited for up to
        `timeout` seconds. Whether all were read (the rest stay in draft())."""
        self._send_when_read = False
        return self.wait_attachments(timeout)

    def _read(self, reads: list, sources=()) -> None:
        """Run reads (callables returning a ReadImage or raising AttachmentError) on a worker;
        their chips are added in the order of the calls to _read. sources: the files as
        (path, name, detail), for draft()."""
        reading = _Reading(self._generation, len(reads), sources=list(sources))
        self._readings.append(reading)

        store = self.store_file

        def work() -> list:
            outcomes = []
            for read in reads:
                try:
                    outcomes.append(read())
                except AttachmentError as e:
                    outcomes.append(e)
                    continue
                if store is not None:
                    try:
                        outcomes[-1].stored = store(outcomes[-1].path, outcomes[-1].name)
                    except Exception:  # noqa: BLE001 (sending copies it, and says what failed)
                        pass
            return outcomes

        def done(outcomes: list) -> None:
            reading.outcomes = outcomes
            self._attach_read()

        def failed(e: BaseException) -> None:  # not a bad file: a fault, reported all the same
            done([AttachmentError(tr("The image could not be read: {why}").format(why=e))])

        self.show_notice(tr("Reading the image…"), error=False)
        reading.job = BackgroundJob(self, work, done, failed, "merlin-attach")

    def _attach_read(self) -> None:
        """Attach the outcomes of the readings that are over, in the order they were started
        (for the box and for a draft put aside for an edit, each on its own: one file slow
        for the draft holds none for the edit); a reading for contents replaced since is
        dropped. Once none is left for the box, report the problems and send if a send was
        waiting."""
        waiting = set()  # generations with an earlier reading not over
        for reading in list(self._readings):
            if reading.outcomes is None or reading.generation in waiting:
                waiting.add(reading.generation)
                continue
            self._readings.remove(reading)
            if reading.generation == self._generation:
                add, problems = self._add_attachment, self._read_problems
            elif self._saved_draft is not None and reading.generation == self._saved_generation:
                add, problems = self._saved_draft[1].append, self._draft_problems
                self.sig_contents_changed.emit()  # the draft on disk names the picture's copy
            else:
                continue
            for outcome in reading.outcomes:
                if isinstance(outcome, ReadImage):
                    add(to_attachment(outcome))
                else:
                    problems.append(str(outcome))
        if self._reading():
            return
        problems, self._read_problems = self._read_problems, []
        self.show_notice("\n".join(problems))
        send, self._send_when_read = self._send_when_read, False
        self.edit.setReadOnly(False)
        if send and not problems:  # with a file left out, the user decides what to send
            self.submit()

    def _reading(self) -> int:
        """Files still being read for the contents shown (not for contents replaced since)."""
        return sum(r.count for r in self._readings if r.generation == self._generation)

    def drop_readings(self) -> None:
        """Files still being read will not be attached (the contents are being replaced, or
        the window closed)."""
        self._generation += 1
        self._send_when_read = False
        self.edit.setReadOnly(False)
        self._read_problems = []

    def add_mime(self, mime: QMimeData) -> int:
        """Images or files from a drop or a paste."""
        if mime.hasUrls() and any(u.isLocalFile() for u in mime.urls()):
            return self.add_paths([_local_path(u) for u in mime.urls() if u.isLocalFile()])
        # an image file's bytes as they came (Qt's imageData() decodes on this thread)
        for fmt, ext in PASTED_FORMATS:
            if mime.hasFormat(fmt):
                return int(self.add_image(bytes(mime.data(fmt).data()), ext=ext))
        if mime.hasImage():
            return int(self.add_image(QImage(mime.imageData())))
        if mime.hasUrls():
            self.show_notice(tr("Only files on this computer can be attached."))
        return 0

    def _add_attachment(self, attachment: Attachment) -> None:
        self._attachments.append(attachment)
        chip = AttachmentChip(attachment)
        chip.presets = dict(self._presets)
        chip.retranslate()
        chip.sig_remove.connect(self._user_removed)
        chip.sig_detail.connect(lambda a, _key: self.sig_detail.emit(a))
        chip.sig_detail.connect(self.sig_contents_changed)
        self.chips.insertWidget(self.chips.count() - 1, chip)
        self.chip_row.setVisible(True)
        self.sig_attached.emit(attachment)
        self.sig_contents_changed.emit()

    def _user_removed(self, attachment: Attachment) -> None:
        self.remove_attachment(attachment)
        self.sig_detached.emit(attachment)

    def chip(self, attachment: Attachment) -> AttachmentChip | None:
        for i in range(self.chips.count()):
            w = self.chips.itemAt(i).widget()
            if isinstance(w, AttachmentChip) and w.attachment is attachment:
                return w
        return None

    def set_presets(self, presets: dict[str, int]) -> None:
        """Tokens of each detail ("" = the default, "fast", "detailed", "full")."""
        self._presets = dict(presets)
        for a in self._attachments:
            c = self.chip(a)
            if c is not None:
                c.presets = dict(presets)
                c.retranslate()

    def image_tokens(self, attachment: Attachment) -> int | None:
        """The budget chosen for this attachment (None: the default)."""
        return self._presets.get(attachment.detail) if attachment.detail else None

    def detail_of(self, tokens: int | None) -> str:
        """The detail whose budget is `tokens` ("" for None or a budget no preset has)."""
        return next((name for name, t in self._presets.items() if t == tokens), "")

    def set_image_status(self, attachment: Attachment, text: str) -> None:
        c = self.chip(attachment)
        if c is not None:
            c.set_status(text)

    def remove_attachment(self, attachment: Attachment) -> None:
        if attachment in self._attachments:
            self._attachments.remove(attachment)
        for i in range(self.chips.count()):
            w = self.chips.itemAt(i).widget()
            if isinstance(w, AttachmentChip) and w.attachment is attachment:
                w.setParent(None)
                w.deleteLater()
                break
        self.chip_row.setVisible(bool(self._attachments))
        self.sig_contents_changed.emit()

    def show_notice(self, text: str, error: bool = True) -> None:
        self.notice.setText(text)
        self.notice.setVisible(bool(text))
        pal = self.notice.palette()
        pal.setColor(
            QPalette.WindowText, theme.banner_colors("error")[1] if error else theme.muted_text()
        )
        self.notice.setPalette(pal)
        if text:
            self._notice_timer.start()

    # ---- language ------------------------------------------------------------------------

    def retranslate(self) -> None:
        self.edit.setPlaceholderText(tr("Ask about an image, or anything…"))
        self.attach_button.setToolTip(tr("Attach images (or drop them, or paste)"))
        self.hint.setText(tr("Enter sends · Shift+Enter new line · Esc stops"))
        self.edit_label.setText(
            tr("Editing an earlier message: sending replaces it and everything after it.")
        )
        self.edit_cancel.setText(tr("Cancel edit"))
        self.set_busy(self._busy)
        for i in range(self.chips.count()):
            w = self.chips.itemAt(i).widget()
            if isinstance(w, AttachmentChip):
                w.remove.setToolTip(tr("Remove {name}").format(name=w.attachment.name))
                w.retranslate()

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self.retranslate()
        super().changeEvent(event)
