"""The conversation list: search, new, rename (double-click or F2), delete.

Each row shows the title and, on a second, smaller line, when the chat was last used
(app/model/dates.py: "Today 14:05", "Yesterday", "Mon", "3 Nov 2026"), painted by
_ChatDelegate so the item's text stays the title (renaming edits just that). The dates follow
a language switch and `clock` (time.time; tests set a fixed one).
"""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QFontMetrics, QKeySequence, QPalette, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from merlin.app.i18n import tr
from merlin.app.model.dates import chat_date, full_date
from merlin.app.model.store import ConversationRow
from merlin.app.widgets import theme
from merlin.app.widgets.icons import icon

ID_ROLE = Qt.UserRole + 1
TIME_ROLE = Qt.UserRole + 2  # when the chat was last used (seconds since the epoch)
DATE_ROLE = Qt.UserRole + 3  # that, as the list's second line says it
TITLE_ROLE = Qt.UserRole + 4  # the title the store holds
DATE_SCALE = 0.85  # the date line's font, relative to the title's
PAD = 3  # pixels above, between and below the two lines


def _date_font(font):
    return theme.scaled_font(font, DATE_SCALE)


class _ChatDelegate(QStyledItemDelegate):
    """Paints a row as its title, elided, over its date line (muted, smaller)."""

    def paint(self, painter, option, index) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        title, date = opt.text, index.data(DATE_ROLE) or ""
        opt.text = ""
        style = opt.widget.style() if opt.widget else None
        if style is not None:
            style.drawControl(QStyle.CE_ItemViewItem, opt, painter, opt.widget)
        r = opt.rect.adjusted(6, PAD, -6, -PAD)
        selected = bool(opt.state & QStyle.State_Selected)
        fm = opt.fontMetrics
        painter.save()
        painter.setFont(opt.font)
        painter.setPen(opt.palette.color(QPalette.HighlightedText if selected else QPalette.Text))
        top = QRect(r.left(), r.top(), r.width(), fm.height())
        painter.drawText(
            top, Qt.AlignLeft | Qt.AlignVCenter, fm.elidedText(title, Qt.ElideRight, r.width())
        )
        small = _date_font(opt.font)
        painter.setFont(small)
        sfm = painter.fontMetrics()
        muted = theme.muted_text(opt.palette)
        painter.setPen(opt.palette.color(QPalette.HighlightedText) if selected else muted)
        line = QRect(r.left(), top.bottom() + 1 + PAD, r.width(), sfm.height())
        painter.drawText(
            line, Qt.AlignLeft | Qt.AlignVCenter, sfm.elidedText(date, Qt.ElideRight, r.width())
        )
        painter.restore()

    def sizeHint(self, option, index) -> QSize:  # noqa: N802 (Qt name)
        size = super().sizeHint(option, index)
        small = QFontMetrics(_date_font(option.font)).height()
        return QSize(size.width(), option.fontMetrics.height() + small + 3 * PAD)


SEARCH_PAUSE_MS = 150


class ConversationList(QWidget):
    """sig_selected(int): the user opened a conversation.
    sig_new_requested(): the user wants a new, empty chat.
    sig_rename_requested(int, str): conversation id, new title.
    sig_delete_requested(int): conversation id (the window asks for confirmation).
    sig_search_changed(str): the search text changed (once typing pauses for SEARCH_PAUSE_MS:
    a search reads every message's text, ~40 ms at 20,000 messages, which a keystroke each
    would repeat while the user types).
    """

    sig_selected = Signal(int)
    sig_new_requested = Signal()
    sig_rename_requested = Signal(int, str)
    sig_delete_requested = Signal(int)
    sig_search_changed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._filling = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 4, 8)
        layout.setSpacing(6)
        top = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setClearButtonEnabled(True)
        self.search.addAction(icon("search"), QLineEdit.LeadingPosition)
        self._search_pause = QTimer(self, singleShot=True, interval=SEARCH_PAUSE_MS)
        self._search_pause.timeout.connect(lambda: self.sig_search_changed.emit(self.search.text()))
        self.search.textChanged.connect(self._search_pause.start)
        self.new_button = QToolButton()
        self.new_button.setIcon(icon("new-chat"))
        self.new_button.setIconSize(QSize(20, 20))
        self.new_button.clicked.connect(self.sig_new_requested)
        top.addWidget(self.search, 1)
        top.addWidget(self.new_button)
        layout.addLayout(top)
        self.list = QListWidget()
        self.list.setEditTriggers(
            QAbstractItemView.DoubleClicked | QAbstractItemView.EditKeyPressed
        )
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemChanged.connect(self._on_item_changed)
        self.list.setUniformItemSizes(True)
        self.list.setItemDelegate(_ChatDelegate(self.list))
        self.clock = time.time  # what "now" is for the dates (tests: a fixed clock)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.ElideRight)
        layout.addWidget(self.list, 1)
        self.empty_label = QLabel()  # says why the list is empty (a search without a match)
        self.empty_label.setTextFormat(Qt.PlainText)  # names, paths, servers' words: never HTML
        self.empty_label.setWordWrap(True)
        self.empty_label.setAlignment(Qt.AlignHCenter | Qt.AlignTop)
        self.empty_label.setVisible(False)
        layout.addWidget(self.empty_label)
        delete = QShortcut(QKeySequence.Delete, self.list, context=Qt.WidgetShortcut)
        delete.activated.connect(self._delete_current)
        self.retranslate()

    def set_conversations(self, rows: list[ConversationRow], current_id: int | None) -> None:
        self._filling = True
        self.list.clear()
        for row in rows:
            item = QListWidgetItem(row.title)
            item.setData(ID_ROLE, row.id)
            item.setData(TITLE_ROLE, row.title)  # what a blank rename goes back to
            item.setData(TIME_ROLE, float(row.updated or row.created or 0.0))
            item.setFlags(item.flags() | Qt.ItemIsEditable)
            self.list.addItem(item)
            if row.id == current_id:
                self.list.setCurrentItem(item)
        self._update_dates()
        self._filling = False
        self._update_empty_label()

    def _update_dates(self) -> None:
        """Each row's date line and tooltip, in the current language, against clock()."""
        now = self.clock()
        filling, self._filling = self._filling, True  # setData is not a rename
        for i in range(self.list.count()):
            item = self.list.item(i)
            ts = item.data(TIME_ROLE) or 0.0
            item.setData(DATE_ROLE, chat_date(ts, now, tr) if ts else "")
            item.setToolTip(f"{item.text()}\n{full_date(ts)}" if ts else item.text())
        self._filling = filling

    def dates(self) -> list[str]:
        return [self.list.item(i).data(DATE_ROLE) for i in range(self.list.count())]

    def _update_empty_label(self) -> None:
        search = self.search.text().strip()
        if self.list.count() == 0 and search:
            self.empty_label.setText(tr("No chat matches “{text}”.").format(text=search))
        elif self.list.count() == 0:
            self.empty_label.setText(tr("No chats yet: ask something to start one."))
        self.empty_label.setVisible(self.list.count() == 0)

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(ID_ROLE) if item else None

    def select(self, conversation_id: int | None) -> None:
        self._filling = True
        self.list.setCurrentItem(None)
        for i in range(self.list.count()):
            if self.list.item(i).data(ID_ROLE) == conversation_id:
                self.list.setCurrentItem(self.list.item(i))
        self._filling = False

    def titles(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def _on_current(self, current: QListWidgetItem | None, _previous) -> None:
        if current is not None and not self._filling:
            self.sig_selected.emit(current.data(ID_ROLE))

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if self._filling:
            return
        title = item.text().strip()
        if title:
            filling, self._filling = self._filling, True  # setData is not a rename
            item.setData(TITLE_ROLE, title)
            self._filling = filling
            self.sig_rename_requested.emit(item.data(ID_ROLE), title)
        else:  # a chat keeps its title: a blank row had stayed until the next refresh
            filling, self._filling = self._filling, True
            item.setText(item.data(TITLE_ROLE))
            self._filling = filling

    def _delete_current(self) -> None:
        cid = self.current_id()
        if cid is not None:
            self.sig_delete_requested.emit(cid)

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        menu = QMenu(self)
        menu.addAction(icon("edit"), tr("Rename"), lambda: self.list.editItem(item))
        menu.addAction(
            icon("delete"), tr("Delete"), lambda: self.sig_delete_requested.emit(item.data(ID_ROLE))
        )
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def retranslate(self) -> None:
        self.search.setPlaceholderText(tr("Search chats"))
        self.new_button.setToolTip(tr("New chat (Ctrl+N)"))
        self._update_empty_label()
        self._update_dates()

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self.retranslate()
        super().changeEvent(event)
