"""Kept versions and branches in a chat tab: regenerate writes a new version of an answer, and the ←/→ switch
on a message (or Alt+Left / Alt+Right) shows another version, with the continuation that version had.

The store keeps the tree and which version is shown (app/store/branches.py); the tab shows the visible thread
and sends exactly it to the model, so a switch changes what the next answer sees. A switch runs no model: the
prompt of the next answer shares its prefix with what that branch sent before, and the engine's prefix cache
finds those pages by their content.
"""

from __future__ import annotations

import logging

from PySide6.QtWidgets import QApplication

from app.store import StoreError

log = logging.getLogger(__name__)


class BranchingChat:
    """Mixed into ChatTab; uses its `store`, `chat_id`, `view`, `backend`, `answer` and `_regenerating` (the
    answer being written again until its new version is stored, None otherwise)."""

    def regenerate(self, message_id: int | None = None) -> bool:
        """Write the last answer (or answer `message_id`) again as a new version of it; the old one is kept."""
        self._saves.retry()
        if self.is_streaming:
            return False
        if not self.backend.is_loaded:
            self.show_notice("No model is loaded yet. Wait for it to load, or open one from the Model menu.")
            return False
        widgets = self.view.message_widgets()
        if message_id is None:
            if not widgets or widgets[-1].role != "assistant":
                return False
            message_id = widgets[-1].message_id
        if message_id not in [w.message_id for w in widgets if w.role == "assistant"]:
            return False
        self._end_edit()
        self.view.remove_from(message_id)  # still stored: it comes back as a version beside the new answer
        self.clear_notice()
        self._regenerating = message_id
        self._start_answer()
        return True

    def _branch_answer_ended(self, answered: bool) -> None:
        """An answer ended; one that never started leaves the old version on screen where it was."""
        regenerating, self._regenerating = self._regenerating, None
        if regenerating is not None and not answered:
            self.reload()

    def switch_version(self, message_id: int, step: int) -> bool:
        """Show the version `step` (-1, +1) away from message `message_id`, and the rest of the thread as that
        version left it; False when there is none or the chat is answering."""
        if self.is_streaming:
            return False
        try:
            versions = self.store.message_versions(self.chat_id).get(message_id, [])
            index = versions.index(message_id) + step if message_id in versions else -1
            if not 0 <= index < len(versions):
                return False
            self.store.select_version(versions[index])
            thread = [m for m in self.store.messages(self.chat_id) if self.shows(m)]
        except StoreError as e:
            self.show_notice(f"Could not switch versions: {e}")
            return False
        self._end_edit()  # the message being edited may be on the branch that leaves the screen
        kept = [w.message_id for w in self.view.message_widgets()]
        kept = kept[: kept.index(message_id)] if message_id in kept else kept
        self.view.remove_from(message_id)
        for message in thread[len(kept) :]:
            self._add_widget(message)
        self.refresh_context_meter()  # the conversation changed: count it again (this also updates the controls)
        return True

    def step_version(self, step: int) -> bool:
        """Alt+Left / Alt+Right: switch the message that has the keyboard focus, else the lowest message that
        has other versions; the focus then stays on the version shown, so the keys can be pressed again."""
        widgets = self.view.message_widgets()
        focus = QApplication.focusWidget()
        target = next((w for w in widgets if focus is not None and (w is focus or w.isAncestorOf(focus))), None)
        if target is None or target.versions.count < 2:
            target = next((w for w in reversed(widgets) if w.versions.count > 1), None)
        if target is None:
            return False
        position = widgets.index(target)
        if not self.switch_version(target.message_id, step):
            return False
        self.view.message_widgets()[position].body.setFocus()
        return True

    def _show_versions(self, streaming: bool) -> None:
        """Put each message's "2/3" and its ←/→ (off while the chat answers) in step with the store."""
        try:
            versions = self.store.message_versions(self.chat_id)
        except (StoreError, KeyError) as e:  # a deferred refresh after the store closed or the chat went
            log.info("chat %s: versions not shown: %s", self.chat_id, e)
            return
        for widget in self.view.message_widgets():
            ids = versions.get(widget.message_id, [widget.message_id])
            index = ids.index(widget.message_id) if widget.message_id in ids else 0
            widget.versions.set_versions(index, len(ids), enabled=not streaming)

    @staticmethod
    def shows(message: object) -> bool:
        """Whether the tab shows this message (the compare view's columns and system turns are not)."""
        return message.role in ("user", "assistant") and message.column is None
