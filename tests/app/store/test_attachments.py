"""Attachments: stored once by content hash; files go when no message uses them, and not before."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time

import pytest

from app.store import Store


def test_same_bytes_stored_once(store):
    data = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    sha = store.add_attachment(data, "png")
    assert sha == hashlib.sha256(data).hexdigest()
    assert store.add_attachment(data, ".PNG") == sha
    assert store.add_attachment(bytearray(data), "jpg") == sha  # first suffix wins: one file
    path = store.attachment_path(sha)
    assert path == store.data_dir / "attachments" / f"{sha}.png"
    assert path.read_bytes() == data
    assert [p.name for p in store.attachments_dir.iterdir()] == [path.name]
    other = store.add_attachment(b"other", ".webp")
    assert store.attachment_path(other).name == f"{other}.webp"


def test_missing_file_is_written_again(store):
    sha = store.add_attachment(b"abc", "png")
    store.attachment_path(sha).unlink()
    assert store.add_attachment(b"abc", "png") == sha
    assert store.attachment_path(sha).read_bytes() == b"abc"


@pytest.mark.parametrize("suffix", ["", ".", "../png", "p/g", "png ", "x" * 17, None])
def test_bad_suffix_is_refused(store, suffix):
    with pytest.raises(ValueError, match="suffix"):
        store.add_attachment(b"abc", suffix)
    assert not store.attachments_dir.exists() or list(store.attachments_dir.iterdir()) == []


def test_bad_data_and_unknown_sha(store):
    with pytest.raises(TypeError, match="bytes"):
        store.add_attachment("text, not bytes", "png")
    with pytest.raises(KeyError, match="no attachment 'deadbeef'"):
        store.attachment_path("deadbeef")


def test_files_removed_when_unused_and_kept_while_used(store):
    shared = store.add_attachment(b"shared image", "png")
    only_a = store.add_attachment(b"only in a", "png")
    a = store.create_chat("a")
    b = store.create_chat("b")
    store.add_message(a.id, "user", "two images", images=[shared, only_a])
    store.add_message(a.id, "user", "same again", images=[shared])
    store.add_message(b.id, "user", "shared", images=[shared])
    shared_path, only_a_path = store.attachment_path(shared), store.attachment_path(only_a)

    store.delete_chat(a.id)
    assert not only_a_path.exists()
    with pytest.raises(KeyError):
        store.attachment_path(only_a)
    assert shared_path.read_bytes() == b"shared image"  # chat b still uses it
    assert store.messages(b.id)[0].images == [shared]

    store.delete_chat(b.id)
    assert not shared_path.exists()
    assert list(store.attachments_dir.iterdir()) == []


def test_delete_messages_from_removes_unused_files(store):
    chat = store.create_chat()
    early = store.add_attachment(b"early", "png")
    late = store.add_attachment(b"late", "png")
    store.add_message(chat.id, "user", "first", images=[early])
    cut = store.add_message(chat.id, "user", "second", images=[late, early])
    store.delete_messages_from(chat.id, cut.id)
    assert store.attachment_path(early).exists()  # still used by the first message
    assert not (store.attachments_dir / f"{late}.png").exists()


def test_same_image_twice_in_one_message(store):
    chat = store.create_chat()
    sha = store.add_attachment(b"twice", "png")
    message = store.add_message(chat.id, "user", "both", images=[sha, sha])
    assert store.messages(chat.id)[0].images == [sha, sha] == message.images


def test_unsent_attachments_are_swept_after_a_day(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    with Store(path) as store:
        old = store.add_attachment(b"dropped yesterday, never sent", "png")
        fresh = store.add_attachment(b"draft in progress", "png")
        sent = store.add_attachment(b"sent long ago", "png")
        chat = store.create_chat()
        store.add_message(chat.id, "user", "with image", images=[sent])
        stray = store.attachments_dir / ("ab" * 32 + ".png")  # a file whose row never got written
        stray.write_bytes(b"crash leftover")
        unrelated = store.attachments_dir / "notes.txt"
        unrelated.write_bytes(b"not ours")
        old_path, fresh_path, sent_path = (store.attachment_path(s) for s in (old, fresh, sent))
    day_ago = time.time() - 2 * 24 * 3600
    raw = sqlite3.connect(path)
    raw.execute("UPDATE attachments SET created_at = ? WHERE sha IN (?, ?)", (day_ago, old, sent))
    raw.commit()
    raw.close()
    for file in (old_path, sent_path, stray, unrelated):
        os.utime(file, (day_ago, day_ago))
    with Store(path) as store:
        assert not old_path.exists() and not stray.exists()
        with pytest.raises(KeyError):
            store.attachment_path(old)
        assert fresh_path.exists() and sent_path.exists() and unrelated.exists()
        assert store.attachment_path(fresh) == fresh_path
