"""The window's deleting and exporting of saved chats (a MainWindow mixin): asking first, closing the chat's
tab and stopping its answer before the rows go, and writing Markdown or JSON where the user picks."""

from __future__ import annotations

import json
import re
from pathlib import Path

from PySide6.QtWidgets import QCheckBox, QFileDialog, QGridLayout, QMessageBox

from app.ui.tasks import spawn

EXPORT_STATS_KEY = "export.include_stats"  # the Markdown export dialog's checkbox, as last left


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

    def ask_export_chat(self, chat_id: int, fmt: str) -> QFileDialog:
        """Ask where to export (a Markdown export also asks whether to include the answers' statistics);
        returns the (non-blocking) dialog."""
        title = self.store.get_chat(chat_id).title
        suffix = ".md" if fmt == "markdown" else ".json"
        name = re.sub(r"[^\w\- ]+", "", title).strip() or "chat"
        dialog = QFileDialog(self, "Export chat", str(Path.home() / (name + suffix)))
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setNameFilter("Markdown (*.md)" if fmt == "markdown" else "JSON (*.json)")
        dialog.setDefaultSuffix(suffix[1:])
        stats = None
        if fmt == "markdown":
            dialog.setOption(QFileDialog.Option.DontUseNativeDialog)  # a platform's dialog takes no extra widget
            stats = QCheckBox("Include each answer's statistics (tokens, speed, stop reason)", dialog)
            stats.setChecked(bool(self.store.get_setting(EXPORT_STATS_KEY, False)))
            layout = dialog.layout()
            if isinstance(layout, QGridLayout):
                layout.addWidget(stats, layout.rowCount(), 0, 1, layout.columnCount())
            else:
                layout.addWidget(stats)
        dialog.fileSelected.connect(lambda path: self._export_chosen(chat_id, fmt, path, stats))
        dialog.open()
        return dialog

    def _export_chosen(self, chat_id: int, fmt: str, path: str, stats: QCheckBox | None) -> None:
        if stats is not None:
            self.store.set_setting(EXPORT_STATS_KEY, stats.isChecked())  # the dialog's next default
        self.export_chat(chat_id, fmt, path, include_stats=stats is not None and stats.isChecked())

    def export_chat(self, chat_id: int, fmt: str, path: str | Path, include_stats: bool = False) -> bool:
        """Write the chat to `path` as Markdown (its images in a folder beside it, statistics when asked) or
        JSON; a failure is shown in the status bar."""
        try:
            if fmt == "markdown":
                self.store.export.write_markdown(chat_id, path, include_stats=include_stats)
            elif fmt == "json":
                content = json.dumps(self.store.export.json(chat_id), indent=2, ensure_ascii=False)
                Path(path).write_text(content, encoding="utf-8")
            else:
                raise ValueError(f"unknown export format {fmt!r}; use 'markdown' or 'json'")
        except (OSError, ValueError) as e:
            self.show_error(f"Could not export to {path}: {e}")
            return False
        self.statusBar().showMessage(f"Exported to {path}", 5000)
        return True

    def _export_current(self, fmt: str) -> None:
        tab = self.current_tab()
        if tab is not None:
            self.ask_export_chat(tab.chat_id, fmt)
