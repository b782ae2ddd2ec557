"""open_store on damaged, garbage, empty and unwritable data files (app/store/recovery.py).

Tried: a valid database with a damaged page in the middle of its messages (its chat open when the app last
closed), a file of random bytes, a zero-byte file, a data folder without write permission, a healthy file
(untouched, no notice). Each time the damaged file must still exist beside the new one, byte for byte.
"""

from __future__ import annotations

import os
import random

import pytest

from app.store import Store, StoreError
from app.store.recovery import open_store


def fill(path, chats: int = 4, messages: int = 300) -> dict[int, int]:
    """A store with `chats` chats of `messages` messages each (about 1 MB); returns messages per chat id."""
    with Store(path) as store:
        made = {}
        for c in range(chats):
            chat = store.create_chat(f"chat {c}")
            for m in range(messages):
                store.add_message(
                    chat.id, "user" if m % 2 == 0 else "assistant", f"message {m} of chat {c}: " + "x" * 800
                )
            made[chat.id] = messages
    return made


def damage_a_page(path, fraction: float) -> None:
    """Overwrite one 4 KiB page about `fraction` into the file with random bytes (the header stays valid)."""
    size = path.stat().st_size
    page = max(2, int(size * fraction) // 4096)
    with open(path, "r+b") as f:
        f.seek(page * 4096)
        f.write(random.Random(page).randbytes(4096))


def test_a_damaged_page_is_moved_aside_and_the_rest_recovered(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    made = fill(path)
    damage_a_page(path, 0.5)
    original = path.read_bytes()
    opened = open_store(path)
    try:
        assert opened.moved_to is not None and opened.moved_to.read_bytes() == original  # kept, not deleted
        assert "damaged" in opened.notice and str(opened.moved_to) in opened.notice
        chats = opened.store.list_chats()
        kept = sum(len(opened.store.messages(c.id)) for c in chats)
        assert len(chats) >= 1 and 0 < kept < sum(made.values())  # a page's rows lost, the rest kept
        assert opened.recovered["messages"] == kept
        opened.store.create_chat("after recovery")  # the new file takes writes
    finally:
        opened.store.close()
    reopened = open_store(path)  # and opens cleanly next time
    assert reopened.notice is None
    reopened.store.close()


def test_a_garbage_file_gets_its_own_message_and_a_fresh_store(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    path.write_bytes(random.Random(1).randbytes(10_000))
    opened = open_store(path)
    assert "not a database" in opened.notice and "nothing in it could be read" in opened.notice
    assert opened.moved_to.stat().st_size == 10_000 and opened.store.list_chats() == []
    opened.store.close()


def test_an_empty_file_gets_its_own_message(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    path.write_bytes(b"")
    opened = open_store(path)
    assert "was empty (0 bytes)" in opened.notice and opened.moved_to.exists()
    opened.store.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_named_with_what_to_do(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(StoreError, match=r"data folder .*data is read-only.*TANDEM_DATA_DIR"):
            open_store(folder / "tandem.sqlite3")
    finally:
        folder.chmod(0o755)


def test_a_read_only_folder_check_names_the_folder(tmp_path, monkeypatch):
    # as root the permission bits do not stop writes, so the check is driven through os.access here
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(StoreError, match=r"read-only for this user.*TANDEM_DATA_DIR"):
        open_store(tmp_path / "tandem.sqlite3")


def test_a_healthy_file_opens_as_it_is(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    made = fill(path, chats=2, messages=5)
    opened = open_store(path)
    assert opened.notice is None and opened.moved_to is None
    assert sorted(len(opened.store.messages(c.id)) for c in opened.store.list_chats()) == sorted(made.values())
    opened.store.close()
