"""Drafts: a chat's unsent message and its images survive closing the store, the attachment sweep and other
chats' deletes, and go with their chat.

Bad inputs tried: a draft for a chat that does not exist, an image sha never stored, a non-string text.
"""

from __future__ import annotations

import os
import time

import pytest

from app.store import Store
from app.store.attachments import UNSENT_GRACE_S


def test_a_draft_with_images_comes_back_after_reopening(store, tmp_path):
    chat = store.create_chat("Drafting")
    sha = store.add_attachment(b"picture bytes", "png")
    store.save_draft(chat.id, "half a thought", [(sha, "cat.png")])
    store.close()
    with Store(tmp_path / "tandem.sqlite3") as reopened:
        draft = reopened.draft(chat.id)
        assert (draft.text, draft.images) == ("half a thought", [(sha, "cat.png")])
        reopened.save_draft(chat.id, "a whole thought")  # replaces it, images and all
        assert reopened.draft(chat.id).images == [] and reopened.draft(chat.id).text == "a whole thought"
        reopened.save_draft(chat.id, "")  # an empty draft is no draft
        assert reopened.draft(chat.id) is None


def test_a_drafts_image_outlives_the_sweep_and_another_chats_delete(store, tmp_path):
    sent_in = store.create_chat("Sent")
    drafting = store.create_chat("Drafting")
    shared = store.add_attachment(b"shared picture", "png")
    lonely = store.add_attachment(b"only in the draft", "jpg")
    store.add_message(sent_in.id, "user", "look", images=[shared])
    store.save_draft(drafting.id, "", [(shared, "a.png"), (lonely, "b.jpg")])
    store.delete_chat(sent_in.id)  # its message's image is still in the draft
    assert store.attachment_path(shared).is_file()
    old = time.time() - 2 * UNSENT_GRACE_S  # both unsent for two days: the sweep's age
    with store._db.write() as conn:
        conn.execute("UPDATE attachments SET created_at = ?", (old,))
    for sha in (shared, lonely):
        os.utime(store.attachment_path(sha), (old, old))
    store.close()
    with Store(tmp_path / "tandem.sqlite3") as reopened:
        assert [name for _sha, name in reopened.draft(drafting.id).images] == ["a.png", "b.jpg"]
        assert reopened.attachment_path(shared).is_file() and reopened.attachment_path(lonely).is_file()
        reopened.clear_draft(drafting.id)
    with Store(tmp_path / "tandem.sqlite3") as swept:  # unused now, and old: gone
        with pytest.raises(KeyError):
            swept.attachment_path(lonely)


def test_a_draft_goes_with_its_chat_and_bad_drafts_are_refused(store):
    chat = store.create_chat("Short-lived")
    store.save_draft(chat.id, "never sent")
    store.delete_chat(chat.id)
    assert store.draft(chat.id) is None
    with pytest.raises(KeyError, match="no chat"):
        store.save_draft(chat.id, "to nowhere")
    other = store.create_chat("Other")
    with pytest.raises(KeyError, match="add_attachment first"):
        store.save_draft(other.id, "text", [("0" * 64, "ghost.png")])
    with pytest.raises(ValueError, match="string"):
        store.save_draft(other.id, b"bytes")
    assert store.draft(other.id) is None  # nothing half-written
