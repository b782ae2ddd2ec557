"""The store's repositories are plain objects over one Database, wired by what each needs and nothing more."""

from __future__ import annotations

import pytest

from app.store.attachments import Attachments
from app.store.chats import Chats
from app.store.db import Database
from app.store.export import Export
from app.store.messages import Messages
from app.store.model_list import ModelList
from app.store.settings import Settings


def test_repositories_work_without_a_store(tmp_path):
    db = Database(tmp_path / "t.sqlite3")
    try:
        attachments = Attachments(db, tmp_path / "attachments")
        chats = Chats(db, attachments)
        messages = Messages(db, chats, attachments)
        chat = chats.create("Wired by hand")
        sha = attachments.add(b"picture bytes", "png")
        first = messages.add(chat.id, "user", "look", images=[sha])
        messages.add(chat.id, "assistant", "a picture")
        assert [m.text for m in messages.thread(chat.id)] == ["look", "a picture"]
        assert Export(chats, messages, attachments).json(chat.id)["visible_thread"] == [first.id, first.id + 1]
        Settings(db).set("k", [1, 2])
        assert Settings(db).get("k") == [1, 2]
        assert [m.path for m in ModelList(db).all()] == []
        file = attachments.path(sha)
        chats.delete(chat.id)  # the chat's last use of the picture: its row and file go through Attachments
        assert not file.exists()
        with pytest.raises(KeyError, match="no chat"):
            messages.thread(chat.id)
    finally:
        db.close()


def test_the_store_passes_calls_to_its_repositories(store):
    chat = store.create_chat("Through the store")
    store.add_message(chat.id, "user", "hello")
    assert store.get_chat(chat.id) == store._chats.get(chat.id)
    assert store.messages(chat.id) == store._messages.thread(chat.id)
    store.set_setting("theme", "dark")
    assert store._settings.get("theme") == "dark"
    assert store.export.json(chat.id)["chat"]["title"] == "Through the store"
