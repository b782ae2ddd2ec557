"""The window's deleting and exporting of saved chats (a MainWindow mixin): asking first, closing the chat's
tab and stopping its answer before the rows go, and writing Markdown or JSON where the user picks."""

from __future__ import annotations

import json
import re
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.ui.tasks import spawn


class ChatFiles:
    """Mixed into MainWindow, whose store, tabs, sidebar and status bar it uses."""

    def ask_delete_chat(self, chat_id: int) -> QMessageBox:
        """Ask before deleting a chat; returns the (non-blocking) question box."""
        title = self.store.get_chat(chat_id).title
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Delete chat",
            f"Delete “{title}” and all its messages? This cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            self,
        )
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.accepted.connect(lambda: spawn(self.delete_chat(chat_id), name=f"delete-chat-{chat_id}"))
        box.open()
        return box

    async def delete_chat(self, chat_id: int) -> None:
        """Delete a chat now (closing its tab, stopping its answer first)."""
        tab = self.tab_for(chat_id)
        if tab is not None:
            self.tabs.removeTab(self.tabs.indexOf(tab))
            await self._dispose(tab, delete=True)
            if self.tabs.count() == 0:
                self.new_chat()
            self._save_tabs()
        else:
            self.store.delete_chat(chat_id)
            self.sidebar.refresh()

    def ask_export_chat(self, chat_id: int, fmt: str) -> None:
        title = self.store.get_chat(chat_id).title
        suffix = ".md" if fmt == "markdown" else ".json"
        name = re.sub(r"[^\w\- ]+", "", title).strip() or "chat"
        dialog = QFileDialog(self, "Export chat", str(Path.home() / (name + suffix)))
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setNameFilter("Markdown (*.md)" if fmt == "markdown" else "JSON (*.json)")
        dialog.setDefaultSuffix(suffix[1:])
        dialog.fileSelected.connect(lambda path: self.export_chat(chat_id, fmt, path))
        dialog.open()

    def export_chat(self, chat_id: int, fmt: str, path: str | Path) -> bool:
        """Write the chat to `path` as Markdown or JSON; a failure is shown in the status bar."""
        try:
            if fmt == "markdown":
                content = self.store.export_markdown(chat_id)
            elif fmt == "json":
                content = json.dumps(self.store.export_json(chat_id), indent=2, ensure_ascii=False)
            else:
                raise ValueError(f"unknown export format {fmt!r}; use 'markdown' or 'json'")
            Path(path).write_text(content, encoding="utf-8")
        except (OSError, ValueError) as e:
            self.show_error(f"Could not export to {path}: {e}")
            return False
        self.statusBar().showMessage(f"Exported to {path}", 5000)
        return True

    def _export_current(self, fmt: str) -> None:
        tab = self.current_tab()
        if tab is not None:
            self.ask_export_chat(tab.chat_id, fmt)
