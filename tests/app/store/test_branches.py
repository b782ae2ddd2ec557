"""Kept versions and branches in the store: new versions, switching, the visible thread, cutting, reopening."""

from __future__ import annotations

import pytest

from app.store import Store


def texts(store: Store, chat_id: int, **kwargs) -> list[str]:
    return [m.text for m in store.messages(chat_id, **kwargs)]


def test_a_regenerated_answer_is_a_new_version_and_the_old_one_stays(store):
    chat = store.create_chat()
    u1 = store.add_message(chat.id, "user", "q1")
    a1 = store.add_message(chat.id, "assistant", "a1")
    assert (u1.parent_id, a1.parent_id) == (None, u1.id)
    a2 = store.add_message(chat.id, "assistant", "a2", version_of=a1.id)
    assert a2.parent_id == u1.id
    assert texts(store, chat.id) == ["q1", "a2"]  # the new version is shown
    assert store.message_versions(chat.id) == {u1.id: [u1.id], a2.id: [a1.id, a2.id]}
    assert [m.text for m in store.all_messages(chat.id)] == ["q1", "a1", "a2"]
    assert texts(store, chat.id, before=a2.id) == ["q1"]  # the prompt of a version of a2
    store.select_version(a1.id)
    assert texts(store, chat.id) == ["q1", "a1"]
    assert store.message_versions(chat.id)[a1.id] == [a1.id, a2.id]


def test_an_edited_question_starts_a_branch_and_each_keeps_its_continuation(store):
    chat = store.create_chat()
    u1 = store.add_message(chat.id, "user", "A1")
    store.add_message(chat.id, "assistant", "A1 answer")
    store.add_message(chat.id, "user", "A2")
    a2 = store.add_message(chat.id, "assistant", "A2 answer")
    a2b = store.add_message(chat.id, "assistant", "A2 answer, again", version_of=a2.id)
    store.select_version(a2.id)  # branch A shows its first answer to A2
    b1 = store.add_message(chat.id, "user", "B1", version_of=u1.id)  # edit the first question
    assert b1.parent_id is None
    store.add_message(chat.id, "assistant", "B1 answer")  # after the visible thread: under B1
    assert texts(store, chat.id) == ["B1", "B1 answer"]
    store.select_version(u1.id)  # back to A: as it was left, A2's first answer included
    assert texts(store, chat.id) == ["A1", "A1 answer", "A2", "A2 answer"]
    versions = store.message_versions(chat.id)
    assert versions[u1.id] == [u1.id, b1.id] and versions[a2.id] == [a2.id, a2b.id]
    store.add_message(chat.id, "user", "A3")  # a send continues the branch shown
    assert texts(store, chat.id)[-1] == "A3"
    store.select_version(b1.id)
    assert texts(store, chat.id) == ["B1", "B1 answer"]
    store.select_version(a2b.id)  # a message off the visible thread: the thread now runs through it
    assert texts(store, chat.id) == ["A1", "A1 answer", "A2", "A2 answer, again"]


def test_switching_is_saved_and_survives_reopening(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    with Store(path) as store:
        chat = store.create_chat()
        u1 = store.add_message(chat.id, "user", "first")
        store.add_message(chat.id, "user", "second", version_of=u1.id)
        updated = store.get_chat(chat.id).updated_at
        store.select_version(u1.id)
        assert store.get_chat(chat.id).updated_at == updated  # a switch is not an edit: the sidebar order stays
    with Store(path) as store:
        assert texts(store, chat.id) == ["first"]


def test_cutting_a_message_removes_its_branches_below_and_keeps_the_others(store):
    chat = store.create_chat()
    keep_sha = store.add_attachment(b"kept", "png")
    gone_sha = store.add_attachment(b"gone", "png")
    u1 = store.add_message(chat.id, "user", "q", images=[keep_sha])
    a1 = store.add_message(chat.id, "assistant", "a1")
    store.add_message(chat.id, "user", "follow-up", images=[gone_sha])
    store.add_message(chat.id, "assistant", "a2", version_of=a1.id)
    store.delete_messages_from(chat.id, a1.id)  # a1 and its follow-up; a2 is another branch
    assert [m.text for m in store.all_messages(chat.id)] == ["q", "a2"]
    assert texts(store, chat.id) == ["q", "a2"]
    assert not (store.attachments_dir / f"{gone_sha}.png").exists()
    assert store.attachment_path(keep_sha).exists()
    store.delete_messages_from(chat.id, u1.id)
    assert store.all_messages(chat.id) == [] and store.message_versions(chat.id) == {}
    assert store.add_message(chat.id, "user", "anew").parent_id is None


def test_bad_ids_are_refused_and_nothing_is_written(store):
    chat = store.create_chat()
    other = store.create_chat()
    elsewhere = store.add_message(other.id, "user", "other chat")
    store.add_message(chat.id, "user", "mine")
    with pytest.raises(KeyError, match=f"no message with id {elsewhere.id} in chat {chat.id}"):
        store.add_message(chat.id, "assistant", "x", version_of=elsewhere.id)
    with pytest.raises(KeyError, match="no message with id 999"):
        store.select_version(999)
    with pytest.raises(KeyError, match="no message with id 999"):
        store.messages(chat.id, before=999)
    with pytest.raises(KeyError, match="no chat with id 42"):
        store.message_versions(42)
    assert texts(store, chat.id) == ["mine"] and texts(store, other.id) == ["other chat"]


def test_a_compare_chat_keeps_every_column_in_its_thread(store):
    chat = store.create_chat("Compare", kind="compare")
    store.add_message(chat.id, "user", "prompt")
    for column in range(3):
        store.add_message(chat.id, "assistant", f"column {column}", column=column)
    assert [m.column for m in store.messages(chat.id)] == [None, 0, 1, 2]
    assert all(len(v) == 1 for v in store.message_versions(chat.id).values())


def test_a_message_whose_parent_was_lost_follows_the_one_before_it(store):
    """A damaged file's recovery can lose a parent row: what survives still reads as one thread."""
    chat = store.create_chat()
    u1 = store.add_message(chat.id, "user", "q1")
    a1 = store.add_message(chat.id, "assistant", "a1")
    u2 = store.add_message(chat.id, "user", "q2")
    store.add_message(chat.id, "assistant", "a2")
    raw = store._db._conn
    raw.execute("PRAGMA foreign_keys = OFF")
    raw.execute("DELETE FROM messages WHERE id = ?", (u2.id,))  # as a lost page would, without the app's cut
    raw.execute("PRAGMA foreign_keys = ON")
    assert texts(store, chat.id) == ["q1", "a1", "a2"]
    assert store.messages(chat.id)[-1].parent_id == a1.id and store.messages(chat.id)[0].id == u1.id


def test_search_finds_text_in_every_version(store):
    chat = store.create_chat("Versions")
    question = store.add_message(chat.id, "user", "about the axolotl")
    store.add_message(chat.id, "user", "about the capybara", version_of=question.id)
    assert [m.text for m in store.messages(chat.id)] == ["about the capybara"]
    for word in ("axolotl", "capybara"):  # the hidden version too: the chat holds it
        assert [hit.chat.id for hit in store.search_chats(word)] == [chat.id]
