"""Chats and messages: every call, search, newest-first order, cascades, bad input, atomic writes."""

from __future__ import annotations

import sqlite3

import pytest

from app.store import Chat, Message, NotFoundError, Store, StoreError


def test_create_and_get_chat_round_trip(store):
    chat = store.create_chat("Trip plans", system_prompt="Be brief.", settings={"temperature": 0.7, "seed": 3})
    assert isinstance(chat, Chat) and isinstance(chat.id, int)
    assert (chat.title, chat.kind, chat.system_prompt, chat.model) == ("Trip plans", "chat", "Be brief.", None)
    assert chat.settings == {"temperature": 0.7, "seed": 3}
    assert chat.created_at == chat.updated_at > 0
    assert store.get_chat(chat.id) == chat
    defaults = store.create_chat()
    assert (defaults.title, defaults.system_prompt, defaults.settings, defaults.kind) == ("New chat", "", {}, "chat")
    assert store.create_chat("Side by side", kind="compare").kind == "compare"


def test_default_path_is_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    with Store() as default:
        assert default.path == tmp_path / "data" / "tandem.sqlite3"
        assert default.attachments_dir == tmp_path / "data" / "attachments"
        default.create_chat("x")
    assert (tmp_path / "data" / "tandem.sqlite3").is_file()


def test_chats_persist_across_reopen(store):
    chat = store.create_chat("Kept")
    user = store.add_message(chat.id, "user", "hello")
    store.close()
    with Store(store.path) as again:
        assert again.get_chat(chat.id) == store_chat_like(chat, again)
        assert again.messages(chat.id) == [user]


def store_chat_like(chat: Chat, opened: Store) -> Chat:
    # updated_at moved when the message was added; everything else is as created.
    return Chat(**{**chat.__dict__, "updated_at": opened.get_chat(chat.id).updated_at})


def test_list_chats_newest_updated_first(store):
    a, b, c = (store.create_chat(title) for title in ("A", "B", "C"))
    assert [chat.id for chat in store.list_chats()] == [c.id, b.id, a.id]
    store.add_message(a.id, "user", "bump A")
    assert [chat.id for chat in store.list_chats()] == [a.id, c.id, b.id]
    answer = store.add_message(c.id, "assistant", "", complete=False)
    assert [chat.id for chat in store.list_chats()] == [c.id, a.id, b.id]
    store.rename_chat(b.id, "B renamed")
    assert [chat.id for chat in store.list_chats()] == [b.id, c.id, a.id]
    store.update_message(answer.id, text="streamed")
    assert [chat.id for chat in store.list_chats()] == [c.id, b.id, a.id]
    store.update_chat(a.id, model="SmolLM2")
    assert store.list_chats()[0].id == a.id


def test_search_matches_title_or_message_text_ignoring_case(store):
    pasta = store.create_chat("Pasta recipes")
    travel = store.create_chat("Travel")
    store.add_message(travel.id, "user", "Which trains go ÜBER the Alps?")
    store.add_message(travel.id, "assistant", "The Gotthard line, among others.")
    other = store.create_chat("Misc")
    store.add_message(other.id, "user", "nothing about travel")
    store.add_message(travel.id, "user", "more travel tips please")
    assert [c.id for c in store.list_chats("PASTA")] == [pasta.id]
    assert [c.id for c in store.list_chats("gotthard")] == [travel.id]
    assert [c.id for c in store.list_chats("über")] == [travel.id]  # non-ASCII case folding
    assert [c.id for c in store.list_chats("Travel")] == [travel.id, other.id]  # title and text: listed once
    assert store.list_chats("no such words") == []
    assert len(store.list_chats("  ")) == len(store.list_chats(None)) == 3
    assert store.list_chats("%") == []  # no LIKE wildcards


def test_rename_and_update_chat(store):
    chat = store.create_chat("Old", system_prompt="one", settings={"top_k": 5})
    store.rename_chat(chat.id, "  New title  ")
    store.update_chat(chat.id, settings={"top_k": 7})
    got = store.get_chat(chat.id)
    assert (got.title, got.system_prompt, got.settings, got.model) == ("New title", "one", {"top_k": 7}, None)
    store.update_chat(chat.id, system_prompt="two", model="Qwen3-0.6B")
    got = store.get_chat(chat.id)
    assert (got.system_prompt, got.settings, got.model) == ("two", {"top_k": 7}, "Qwen3-0.6B")
    assert got.updated_at > chat.updated_at


def test_messages_round_trip_in_order(store):
    chat = store.create_chat()
    sha = store.add_attachment(b"\x89PNG fake", "png")
    user = store.add_message(chat.id, "user", "What is this?", images=[sha])
    answer = store.add_message(
        chat.id, "assistant", "", settings={"temperature": 0.7}, stats={"new_tokens": 0}, complete=False
    )
    col = store.add_message(chat.id, "assistant", "col two", column=1)
    assert isinstance(user, Message) and user.images == [sha] and answer.complete is False
    assert store.messages(chat.id) == [user, answer, col]
    store.update_message(answer.id, text="A cat.", stats={"new_tokens": 3, "tokens_per_s": 41.5}, complete=True)
    got = store.messages(chat.id)[1]
    assert (got.text, got.stats, got.settings, got.complete) == (
        "A cat.",
        {"new_tokens": 3, "tokens_per_s": 41.5},
        {"temperature": 0.7},
        True,
    )
    store.update_message(answer.id, complete=False)  # one field alone leaves the others
    got = store.messages(chat.id)[1]
    assert (got.text, got.complete) == ("A cat.", False)
    assert [m.column for m in store.messages(chat.id)] == [None, None, 1]


def test_delete_messages_from(store):
    chat = store.create_chat()
    other = store.create_chat()
    u1 = store.add_message(chat.id, "user", "q1")
    a1 = store.add_message(chat.id, "assistant", "a1")
    u2 = store.add_message(chat.id, "user", "q2")
    store.add_message(chat.id, "assistant", "a2")
    kept = store.add_message(other.id, "user", "other chat")
    store.delete_messages_from(chat.id, u2.id)
    assert [m.id for m in store.messages(chat.id)] == [u1.id, a1.id]
    store.delete_messages_from(chat.id, a1.id)  # regenerate the last answer
    assert [m.id for m in store.messages(chat.id)] == [u1.id]
    assert store.messages(other.id) == [kept]
    with pytest.raises(KeyError, match=f"no message with id {kept.id}"):
        store.delete_messages_from(chat.id, kept.id)  # exists, but in another chat
    with pytest.raises(KeyError, match="no chat with id 999"):
        store.delete_messages_from(999, u1.id)
    assert store.messages(other.id) == [kept]


def test_delete_chat_cascades(store):
    chat = store.create_chat()
    keep = store.create_chat("keep")
    sha = store.add_attachment(b"image bytes", "jpg")
    store.add_message(chat.id, "user", "look", images=[sha])
    store.add_message(keep.id, "user", "stays")
    store.delete_chat(chat.id)
    with pytest.raises(KeyError):
        store.get_chat(chat.id)
    with pytest.raises(KeyError):
        store.messages(chat.id)
    assert [c.id for c in store.list_chats()] == [keep.id]
    raw = sqlite3.connect(store.path)
    assert raw.execute("SELECT COUNT(*) FROM messages WHERE chat_id = ?", (chat.id,)).fetchone() == (0,)
    assert raw.execute("SELECT COUNT(*) FROM message_attachments").fetchone() == (0,)
    raw.close()
    with pytest.raises(KeyError, match=f"no chat with id {chat.id}"):
        store.delete_chat(chat.id)


def test_unknown_ids_raise_key_error_with_clear_message(store):
    chat = store.create_chat()
    for call in (
        lambda: store.get_chat(42),
        lambda: store.rename_chat(42, "x"),
        lambda: store.update_chat(42, model="m"),
        lambda: store.delete_chat(42),
        lambda: store.messages(42),
        lambda: store.add_message(42, "user", "hi"),
        lambda: store.export.markdown(42),
        lambda: store.export.json(42),
    ):
        with pytest.raises(NotFoundError) as info:
            call()
        assert isinstance(info.value, KeyError)
        assert str(info.value) == f"no chat with id 42 in {store.path}"
    with pytest.raises(KeyError, match="no message with id 77"):
        store.update_message(77, text="x")
    assert store.messages(chat.id) == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"title": ""}, "title"),
        ({"title": "   "}, "title"),
        ({"title": None}, "title"),
        ({"kind": "group"}, "kind"),
        ({"settings": ["not", "a", "dict"]}, "must be a dict"),
        ({"settings": {"seed": object()}}, "JSON"),
        ({"settings": {"temperature": float("nan")}}, "JSON"),
        ({"system_prompt": 3}, "system_prompt"),
    ],
)
def test_create_chat_rejects_bad_input(store, kwargs, match):
    with pytest.raises(ValueError, match=match):
        store.create_chat(**kwargs)
    assert store.list_chats() == []


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("robot", "hi"), {}, "role"),
        (("user", None), {}, "text"),
        (("user", "hi"), {"column": 4}, "column"),
        (("user", "hi"), {"column": -1}, "column"),
        (("user", "hi"), {"column": True}, "column"),
        (("user", "hi"), {"complete": 1}, "complete"),
        (("user", "hi"), {"stats": {"t": {1, 2}}}, "JSON"),
        (("user", "hi"), {"images": "abc"}, "images"),
        (("user", "hi"), {"images": ["0" * 64]}, "unknown attachment"),
    ],
)
def test_add_message_rejects_bad_input_without_writing(store, args, kwargs, match):
    chat = store.create_chat()
    with pytest.raises(ValueError, match=match):
        store.add_message(chat.id, *args, **kwargs)
    assert store.messages(chat.id) == []
    assert store.get_chat(chat.id).updated_at == chat.updated_at  # the chat's timestamp bump rolled back


def test_update_message_rejects_bad_input_without_writing(store):
    chat = store.create_chat()
    answer = store.add_message(chat.id, "assistant", "kept")
    for kwargs in ({"text": 5}, {"stats": {"x": object()}}, {"complete": "yes"}, {"stats": [1]}):
        with pytest.raises(ValueError):
            store.update_message(answer.id, **kwargs)
    assert store.messages(chat.id) == [answer]


def test_failing_write_leaves_no_partial_rows(store):
    """The message row goes in before its attachment links; a failure at the links must undo the row."""
    chat = store.create_chat()
    sha = store.add_attachment(b"pixels", "png")
    raw = sqlite3.connect(store.path)
    raw.execute(
        "CREATE TRIGGER refuse_links BEFORE INSERT ON message_attachments BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
    )
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="disk says no"):
        store.add_message(chat.id, "user", "with image", images=[sha])
    assert store.messages(chat.id) == []
    assert store.get_chat(chat.id).updated_at == chat.updated_at
    store.add_message(chat.id, "user", "without image")  # the connection is usable afterwards
    assert [m.text for m in store.messages(chat.id)] == ["without image"]


def test_closed_store_raises_store_error(store):
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.list_chats()
    with pytest.raises(StoreError, match="closed"):
        store.create_chat()
