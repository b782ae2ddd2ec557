"""Export: Markdown for people, a JSON-able dict with everything."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def chat(store):
    chat = store.create_chat("Cats & dogs", system_prompt="You are a vet.", settings={"temperature": 0.7})
    store.update_chat(chat.id, model="SmolLM2-135M")
    sha = store.add_attachment(b"fake png", "png")
    store.add_message(chat.id, "user", "What animal is this?", images=[sha])
    store.add_message(
        chat.id,
        "assistant",
        "A **cat**.",
        stats={"new_tokens": 4, "tokens_per_s": 52.123456},
        settings={"temperature": 0.7},
    )
    store.add_message(chat.id, "user", "And now?")
    store.add_message(chat.id, "assistant", "It is a d", complete=False)
    return store.get_chat(chat.id)


def test_export_markdown(store, chat):
    text = store.export_markdown(chat.id)
    sha = store.messages(chat.id)[0].images[0]
    assert text.startswith("# Cats & dogs\n")
    assert "model SmolLM2-135M" in text
    assert "## System prompt\n\nYou are a vet.\n" in text
    assert "## User\n\nWhat animal is this?\n" in text
    assert f"![image 1]({store.attachment_path(sha).as_uri()})" in text
    assert "## Assistant\n\nA **cat**.\n" in text
    assert "*new_tokens: 4, tokens_per_s: 52.12*" in text
    assert text.index("What animal") < text.index("A **cat**") < text.index("And now?") < text.index("It is a d")
    assert text.endswith("It is a d\n\n*(stopped before the end)*\n")


def test_export_markdown_compare_columns(store):
    chat = store.create_chat("Compare", kind="compare")
    store.add_message(chat.id, "user", "prompt")
    store.add_message(chat.id, "assistant", "left", column=0)
    store.add_message(chat.id, "assistant", "right", column=1)
    text = store.export_markdown(chat.id)
    assert "## Assistant (column 1)\n\nleft" in text and "## Assistant (column 2)\n\nright" in text
    assert "Tandem compare" in text


def test_export_json(store, chat):
    exported = store.export_json(chat.id)
    assert json.loads(json.dumps(exported)) == exported  # JSON-serialisable as is
    assert exported["format"] == "tandem-chat" and exported["version"] == 1
    assert exported["chat"]["title"] == "Cats & dogs"
    assert exported["chat"]["system_prompt"] == "You are a vet."
    assert exported["chat"]["settings"] == {"temperature": 0.7}
    messages = exported["messages"]
    assert [(m["role"], m["text"], m["complete"]) for m in messages] == [
        ("user", "What animal is this?", True),
        ("assistant", "A **cat**.", True),
        ("user", "And now?", True),
        ("assistant", "It is a d", False),
    ]
    assert messages[1]["stats"] == {"new_tokens": 4, "tokens_per_s": 52.123456}
    assert messages[1]["settings"] == {"temperature": 0.7}
    sha = messages[0]["images"][0]
    assert exported["attachments"] == {sha: str(store.attachment_path(sha))}
