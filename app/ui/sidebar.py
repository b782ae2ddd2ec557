"""Sidebar: the saved chats, newest first, with search over titles and message text.

Searches run on the store's search worker (app/store/search.py), never on the GUI thread: the window stays
live while a long history is searched, and each keystroke's search interrupts the one before it. Results list
the newest SHOWN_LIMIT matching chats, each with the text around its newest match.
"""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import Future
from typing import Any

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.store.search import SHOWN_LIMIT, SearchHit

SEARCH_DELAY_MS = 200  # search after typing pauses, not on every key


def when(timestamp: float, now: float | None = None) -> str:
    """A short age for a chat's last change: "just now", "5 min ago", "yesterday", or the date."""
    now = time.time() if now is None else now
    age = now - timestamp
    if age < 60:
        return "just now"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    if age < 86400:
        return f"{int(age // 3600)} h ago"
    if age < 2 * 86400:
        return "yesterday"
    return time.strftime("%Y-%m-%d", time.localtime(timestamp))


class Sidebar(QWidget):
    """Lists chats (kind "chat") from the store; asks the window to open, delete or export one."""

    open_requested = Signal(int)
    delete_requested = Signal(int)
    export_requested = Signal(int, str)  # chat id, "markdown" or "json"
    new_chat_requested = Signal()
    _search_done = Signal(int, object)  # search number, its Future; emitted on the worker, handled here

    def __init__(self, store: Any, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("New chat (Ctrl+T)")
        self.new_button.clicked.connect(self.new_chat_requested)
        layout.addWidget(self.new_button)
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search chats")
        self.search_edit.setClearButtonEnabled(True)
        layout.addWidget(self.search_edit)
        self.search_status = QLabel()  # "searching…", "no chat matches", the limit, or why a search failed
        self.search_status.setObjectName("searchStatus")
        self.search_status.setWordWrap(True)
        self.search_status.hide()
        layout.addWidget(self.search_status)
        self.list = QListWidget()
        self.list.setObjectName("chatList")
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.itemActivated.connect(self._activated)
        self.list.itemDoubleClicked.connect(self._activated)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self.list.currentItemChanged.connect(lambda *_: self._update_buttons())
        layout.addWidget(self.list, 1)

        row = QHBoxLayout()
        self.open_button = QPushButton("Open")
        self.open_button.clicked.connect(lambda: self._emit_for_selected(self.open_requested))
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(lambda: self._emit_for_selected(self.delete_requested))
        self.export_button = QToolButton(text="Export")
        self.export_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.export_button)
        menu.addAction("As Markdown…", lambda: self._export_selected("markdown"))
        menu.addAction("As JSON…", lambda: self._export_selected("json"))
        self.export_button.setMenu(menu)
        for widget in (self.open_button, self.delete_button, self.export_button):
            row.addWidget(widget)
        layout.addLayout(row)

        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self.refresh)
        self.search_edit.textChanged.connect(self._search_timer.start)
        self._searcher = store.chat_search()
        self.destroyed.connect(self._searcher.close)  # the worker and its connection go with the widget
        self._search_number = 0  # only the latest search's results are shown
        self._pending: int | None = None
        self._search_done.connect(self._show_search)
        self.refresh()

    def refresh(self) -> None:
        """Reload the list from the store (keeping the selection). With search text, the search starts on
        the worker and the list changes when it ends (``searching`` is True meanwhile)."""
        self._search_number += 1
        search = self.search_edit.text().strip()
        if not search:
            self._pending = None
            self.search_status.hide()
            self._fill([SearchHit(chat, None) for chat in self.store.list_chats() if chat.kind == "chat"])
            return
        number = self._pending = self._search_number
        self.search_status.setText("Searching…")
        self.search_status.show()
        future = self._searcher.submit(search, SHOWN_LIMIT)
        future.add_done_callback(lambda done: self._search_done.emit(number, done))

    @property
    def searching(self) -> bool:
        """True from a search's start until its results are listed."""
        return self._pending is not None

    def _show_search(self, number: int, future: Future[list[SearchHit]]) -> None:
        if number != self._pending:
            return  # a later search (or clearing the box) replaced this one
        self._pending = None
        try:
            hits = future.result()
        except sqlite3.Error as exc:
            self.search_status.setText(f"Search failed: {exc}. Try again; if it keeps failing, restart Tandem.")
            return
        hits = [hit for hit in hits if hit.chat.kind == "chat"]
        if not hits:
            self.search_status.setText("No chat matches.")
        elif len(hits) >= SHOWN_LIMIT:
            self.search_status.setText(f"The {len(hits)} chats with the newest matches.")
        else:
            self.search_status.hide()
        self._fill(hits)

    def _fill(self, hits: list[SearchHit]) -> None:
        selected = self.selected_chat_id()
        self.list.clear()
        now = time.time()
        for hit in hits:
            chat = hit.chat
            lines = [chat.title, when(chat.updated_at, now)]
            if hit.snippet:
                lines.insert(1, hit.snippet)
            item = QListWidgetItem("\n".join(lines))
            item.setData(Qt.ItemDataRole.UserRole, chat.id)
            item.setToolTip(chat.title if not hit.snippet else f"{chat.title}\n{hit.snippet}")
            self.list.addItem(item)
            if chat.id == selected:
                self.list.setCurrentItem(item)
        self._update_buttons()

    def chat_ids(self) -> list[int]:
        """The listed chats' ids, in order."""
        return [self.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.list.count())]

    def selected_chat_id(self) -> int | None:
        item = self.list.currentItem()
        return None if item is None else item.data(Qt.ItemDataRole.UserRole)

    def select(self, chat_id: int) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.ItemDataRole.UserRole) == chat_id:
                self.list.setCurrentRow(i)
                return

    def _update_buttons(self) -> None:
        has = self.selected_chat_id() is not None
        for widget in (self.open_button, self.delete_button, self.export_button):
            widget.setEnabled(has)

    def _activated(self, item: QListWidgetItem) -> None:
        self.open_requested.emit(item.data(Qt.ItemDataRole.UserRole))

    def _emit_for_selected(self, signal: Any) -> None:
        chat_id = self.selected_chat_id()
        if chat_id is not None:
            signal.emit(chat_id)

    def _export_selected(self, fmt: str) -> None:
        chat_id = self.selected_chat_id()
        if chat_id is not None:
            self.export_requested.emit(chat_id, fmt)

    def _context_menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        chat_id = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Open", lambda: self.open_requested.emit(chat_id))
        menu.addAction("Export as Markdown…", lambda: self.export_requested.emit(chat_id, "markdown"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(chat_id, "json"))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.delete_requested.emit(chat_id))
        menu.popup(self.list.viewport().mapToGlobal(pos))
