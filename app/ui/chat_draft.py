"""The message being written in a chat tab, kept as the chat's draft in the store (app/store/drafts.py): saved a
moment after each edit and when the window closes, put back when the chat opens, cleared when it is sent, so a
quit, a restart or a crash loses no typed message and no attached picture."""

from __future__ import annotations

import logging

from app.store import StoreError

log = logging.getLogger(__name__)


class KeepingDraft:
    """Mixed into ChatTab: uses its `store`, `chat_id`, `input`, `strip`, `_draft_timer` (single-shot, started by
    each edit), `_editing_id`, `_num_attaching` and `attach_saved`."""

    @property
    def has_draft(self) -> bool:
        """Whether a message is being written here (text or images not sent yet)."""
        return bool(self.input.toPlainText() or self.strip.attachments())

    def save_draft(self) -> None:
        """Keep the message being written (text and images) as the chat's draft; an empty one is cleared. An edit
        of an earlier message is not a draft: the chat's own draft stays as it was."""
        self._draft_timer.stop()
        if self._editing_id is not None:
            return
        if self._num_attaching:  # a half-restored strip would be saved short: wait for the checks
            self._draft_timer.start()
            return
        try:
            images = [(self.store.add_attachment(a.data, a.suffix, a.sha256), a.name) for a in self.strip.attachments()]
            self.store.save_draft(self.chat_id, self.input.toPlainText(), images)
        except (StoreError, KeyError) as e:  # the typed text stays in the box; the next edit tries again
            log.warning("chat %s: the draft was not saved: %s", self.chat_id, e)

    def _draft_edited(self) -> None:
        if self._editing_id is None:
            self._draft_timer.start()

    def _clear_draft(self) -> None:
        self._draft_timer.stop()
        try:
            self.store.clear_draft(self.chat_id)
        except StoreError as e:
            log.warning("chat %s: the sent message's draft was not cleared: %s", self.chat_id, e)

    def _restore_draft(self) -> None:
        """Put the chat's draft back in the input; its images are checked again off the GUI thread."""
        draft = self.store.draft(self.chat_id)
        if draft is None:
            return
        self.input.setPlainText(draft.text)
        self._draft_timer.stop()  # what was just read needs no saving
        files = []
        for sha, name in draft.images:
            try:
                files.append((self.store.attachment_path(sha), name))
            except KeyError:
                log.warning("chat %s: the draft's image %s is gone", self.chat_id, name)
        if files:
            self.attach_saved(files)
