"""Schema 2 -> 3 (kept versions and branches): every existing chat reads back exactly as it was.

The version-2 file is made the way Tandem 2 made it: its schema by the first two migrations (shipped, never
edited), its chats through the store's API stopped at version 2, which writes the rows Tandem 2 wrote (no
parent_id, no selected_at). What it held is read with plain SQL before the upgrade, so the check does not
lean on the code under test to say what was there.
"""

from __future__ import annotations

import json
import sqlite3

from app.service.reasoning import THINK, format_stats
from app.store import Store
from app.store.migrations import MIGRATIONS


class StoreV2(Store):
    """The store as Tandem wrote it before message versions existed."""

    migrations = MIGRATIONS[:2]


def columns(path, table: str) -> list[str]:
    raw = sqlite3.connect(path)
    try:
        return [row[1] for row in raw.execute(f"PRAGMA table_info({table})")]
    finally:
        raw.close()


def fill_v2(store: Store) -> dict[str, int]:
    """Real chats as the app saves them: a vision question, a JSON-mode chat, a reasoning model's answers with
    their thinking stats, a stopped answer, a compare run, and an empty chat."""
    png = store.add_attachment(b"\x89PNG\r\n\x1a\n fake picture one", "png")
    jpg = store.add_attachment(b"\xff\xd8\xff fake picture two", "jpg")
    vision = store.create_chat("What is in the picture", system_prompt="Describe briefly.", settings={"seed": 3})
    store.update_chat(vision.id, model="tiny-vision")
    store.add_message(vision.id, "user", "What shapes are these?", images=[png, jpg])
    eos = {"new_tokens": 9, "prompt_tokens": 301, "cached_tokens": 256, "eos_reason": "stop_token"}
    store.add_message(vision.id, "assistant", "A red circle and a blue square.", stats=eos, settings={"top_k": 1})
    store.add_message(vision.id, "user", "And this one?", images=[png])
    store.add_message(vision.id, "assistant", "The same red", stats={"new_tokens": 3, "stopped": True}, complete=False)

    json_chat = store.create_chat("JSON", settings={"temperature": 0.2, "json_mode": True})
    store.add_message(json_chat.id, "user", "Give me a user record")
    store.add_message(json_chat.id, "assistant", '{"name": "Ada"}', stats={**eos, "json_mode": True})

    thinking = store.create_chat("Reasoning", settings={"thinking": False, "max_new_tokens": 200})
    stats = {**eos, **format_stats(THINK, False), "thinking_seconds": 1.25}
    store.add_message(thinking.id, "user", "2+2?")
    store.add_message(thinking.id, "assistant", "<think>Two and two.</think>Four.", stats=stats)
    store.add_message(thinking.id, "user", "Times 3?")
    store.add_message(thinking.id, "assistant", "Twelve.", stats={**eos, **format_stats(THINK, True)})

    compare = store.create_chat("Compare: hello", kind="compare")
    store.add_message(compare.id, "user", "hello")
    for column in range(3):
        store.add_message(compare.id, "assistant", f"hi {column}", column=column, settings={"seed": column})

    empty = store.create_chat("Nothing yet")
    store.set_setting("window.geometry", [10, 20, 800, 600])
    store.presets.save("Mine", {"temperature": 0.3})
    return {
        "vision": vision.id,
        "json": json_chat.id,
        "thinking": thinking.id,
        "compare": compare.id,
        "empty": empty.id,
    }


def read_raw(path) -> dict[str, object]:
    """Everything the file holds, by plain SQL: chats, messages (with their images) in id order, settings."""
    raw = sqlite3.connect(path)
    try:
        chats = raw.execute("SELECT id, title, kind, system_prompt, settings, model, updated_at FROM chats").fetchall()
        images: dict[int, list[str]] = {}
        for message_id, sha in raw.execute("SELECT message_id, sha FROM message_attachments ORDER BY 1, position"):
            images.setdefault(message_id, []).append(sha)
        messages = {}
        query = "SELECT id, role, text, stats, settings, col, complete, created_at FROM messages WHERE chat_id = ?"
        for chat in chats:
            rows = raw.execute(query + " ORDER BY id", (chat[0],)).fetchall()
            messages[chat[0]] = [(*row[:3], json.loads(row[3]), json.loads(row[4]), *row[5:], images.get(row[0], []))
                                 for row in rows]  # fmt: skip
        return {
            "chats": [(*chat[:4], json.loads(chat[4]), *chat[5:]) for chat in chats],
            "messages": messages,
            "settings": dict(raw.execute("SELECT key, value FROM settings")),
            "attachments": raw.execute("SELECT sha, suffix, size FROM attachments ORDER BY sha").fetchall(),
        }
    finally:
        raw.close()


def as_raw(message) -> tuple:
    return (message.id, message.role, message.text, message.stats, message.settings, message.column,
            int(message.complete), message.created_at, message.images)  # fmt: skip


def test_upgrading_keeps_every_chat_message_attachment_and_setting(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    with StoreV2(path) as v2:
        chat_ids = fill_v2(v2)
        assert v2.schema_version == 2
    assert "parent_id" not in columns(path, "messages")  # a version-2 file, as Tandem 2 wrote it
    before = read_raw(path)
    files = {p.name: p.read_bytes() for p in (tmp_path / "attachments").iterdir()}

    with Store(path) as store:
        assert store.schema_version == len(MIGRATIONS)  # through message versions (3) and on
        assert {"parent_id", "selected_at"} <= set(columns(path, "messages"))
        chats = {c.id: c for c in store.list_chats()}
        assert [(c[0], c[1], c[2], c[3], c[4], c[5], c[6]) for c in before["chats"]] == [
            (c.id, c.title, c.kind, c.system_prompt, c.settings, c.model, c.updated_at)
            for c in sorted(chats.values(), key=lambda c: c.id)
        ]
        for chat_id, rows in before["messages"].items():
            thread = store.messages(chat_id)
            assert [as_raw(m) for m in thread] == rows  # the visible thread is the chat as it was, whole
            assert [as_raw(m) for m in store.all_messages(chat_id)] == rows  # and nothing else is there
            assert [m.parent_id for m in thread] == [None, *(m.id for m in thread)][: len(thread)]  # one chain
            assert all(len(versions) == 1 for versions in store.message_versions(chat_id).values())
        assert store.get_chat(chat_ids["json"]).settings["json_mode"] is True
        assert store.get_chat(chat_ids["thinking"]).settings["thinking"] is False
        answer = store.messages(chat_ids["thinking"])[1]
        assert answer.stats["reasoning"] == {"start": "<think>", "end": "</think>", "inside": False}
        assert answer.stats["thinking_seconds"] == 1.25
        for message in store.messages(chat_ids["vision"]):
            for sha in message.images:
                assert store.attachment_path(sha).read_bytes() == files[store.attachment_path(sha).name]
        assert store.get_setting("window.geometry") == [10, 20, 800, 600]
        assert [p.settings for p in store.presets.all() if p.name == "Mine"] == [{"temperature": 0.3}]
        assert store.messages(chat_ids["empty"]) == []
        assert store.search_chats("blue square")[0].chat.id == chat_ids["vision"]

        # The upgraded chats branch like new ones: regenerate the last answer of a chat written by Tandem 2.
        last = store.messages(chat_ids["thinking"])[-1]
        store.add_message(chat_ids["thinking"], "assistant", "36.", version_of=last.id)
        assert [m.text for m in store.messages(chat_ids["thinking"])][-2:] == ["Times 3?", "36."]
        store.select_version(last.id)
        assert [as_raw(m) for m in store.messages(chat_ids["thinking"])] == before["messages"][chat_ids["thinking"]]
    after = read_raw(path)
    assert after["settings"] == before["settings"] and after["attachments"] == before["attachments"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "attachments").iterdir()} == files


def test_a_store_stopped_at_version_2_still_reads_and_writes_one_thread(tmp_path):
    """Tools and tests stop a store before version 3 (tools/make_big_history.py --schema 2)."""
    with StoreV2(tmp_path / "tandem.sqlite3") as v2:
        chat = v2.create_chat()
        u1 = v2.add_message(chat.id, "user", "q")
        v2.add_message(chat.id, "assistant", "a")
        assert [m.text for m in v2.messages(chat.id)] == ["q", "a"]
        assert v2.message_versions(chat.id) == {u1.id: [u1.id], u1.id + 1: [u1.id + 1]}
        v2.select_version(u1.id)  # the only version: nothing to write
        v2.delete_messages_from(chat.id, u1.id + 1)
        assert [m.text for m in v2.messages(chat.id)] == ["q"]
