"""The conversation list: search, new, rename (double-click or F2), delete."""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from merlin.app.i18n import tr
from merlin.app.model.store import ConversationRow
from merlin.app.widgets.icons import icon

ID_ROLE = Qt.UserRole + 1


class ConversationList(QWidget):
    """sig_selected(int): the user opened a conversation.
    sig_new_requested(): the user wants a new, empty chat.
    sig_rename_requested(int, str): conversation id, new title.
    sig_delete_requested(int): conversation id (the window asks for confirmation).
    sig_search_changed(str): the search text changed.
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
        self.search.textChanged.connect(self.sig_search_changed)
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
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.ElideRight)
        layout.addWidget(self.list, 1)
        self.empty_label = QLabel()  # says why the list is empty (a search without a match)
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
        now = time.time()
        for row in rows:
            item = QListWidgetItem(row.title)
            item.setData(ID_ROLE, row.id)
            item.setFlags(item.flags() | Qt.ItemIsEditable)
            item.setToolTip(f"{row.title}\n{_when(row.updated, now)}")
            self.list.addItem(item)
            if row.id == current_id:
                self.list.setCurrentItem(item)
        self._filling = False
        self._update_empty_label()

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
            self.sig_rename_requested.emit(item.data(ID_ROLE), title)

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

    def changeEvent(self, event):  # noqa: N802
        if event.type() == QEvent.LanguageChange:
            self.retranslate()
        super().changeEvent(event)


def _when(ts: float, now: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))
