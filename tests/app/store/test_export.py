"""Export: Markdown for people, a JSON-able dict with everything."""

from __future__ import annotations

import io
import json
import re
import shutil
from urllib.parse import unquote

import pytest
from PIL import Image


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
    text = store.export.markdown(chat.id)
    sha = store.messages(chat.id)[0].images[0]
    assert text.startswith("# Cats & dogs\n")
    assert "model SmolLM2-135M" in text
    assert "## System prompt\n\nYou are a vet.\n" in text
    assert "## User\n\nWhat animal is this?\n" in text
    assert f"![image 1](images/{sha}.png)" in text  # relative to the .md, not this computer's data folder
    assert "## Assistant\n\nA **cat**.\n" in text
    assert "new_tokens" not in text  # statistics only when asked
    with_stats = store.export.markdown(chat.id, include_stats=True)
    assert "## Assistant\n\nA **cat**.\n\n*new_tokens: 4, tokens_per_s: 52.12*\n" in with_stats
    assert with_stats.replace("*new_tokens: 4, tokens_per_s: 52.12*\n\n", "") == text
    assert text.index("What animal") < text.index("A **cat**") < text.index("And now?") < text.index("It is a d")
    assert text.endswith("It is a d\n\n*(stopped before the end)*\n")


def test_export_markdown_compare_columns(store):
    chat = store.create_chat("Compare", kind="compare")
    store.add_message(chat.id, "user", "prompt")
    store.add_message(chat.id, "assistant", "left", column=0)
    store.add_message(chat.id, "assistant", "right", column=1)
    text = store.export.markdown(chat.id)
    assert "## Assistant (column 1)\n\nleft" in text and "## Assistant (column 2)\n\nright" in text
    assert "Tandem compare" in text


def test_export_json(store, chat):
    exported = store.export.json(chat.id)
    assert json.loads(json.dumps(exported)) == exported  # JSON-serialisable as is
    assert exported["format"] == "tandem-chat" and exported["version"] == 2
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
    assert exported["visible_thread"] == [m["id"] for m in messages]  # one version of each: all visible
    assert [m["parent_id"] for m in messages] == [None] + [m["id"] for m in messages[:-1]]


@pytest.fixture
def branched(store):
    """u1 -> a1, then a1 regenerated (a2) and u1 edited (u1b -> a3); a2's branch shown, a3's hidden."""
    chat = store.create_chat("Branches")
    u1 = store.add_message(chat.id, "user", "Name a colour.")
    a1 = store.add_message(chat.id, "assistant", "Red.")
    a2 = store.add_message(chat.id, "assistant", "Blue.", version_of=a1.id)
    u1b = store.add_message(chat.id, "user", "Name a fruit.", version_of=u1.id)
    a3 = store.add_message(chat.id, "assistant", "A pear.")
    store.select_version(u1.id)
    return chat, [u1, a1, a2, u1b, a3]


def test_export_markdown_writes_the_visible_branch(store, branched):
    chat, (u1, a1, a2, u1b, a3) = branched
    text = store.export.markdown(chat.id)
    assert "## User (version 1 of 2)\n\nName a colour.\n" in text
    assert "## Assistant (version 2 of 2)\n\nBlue.\n" in text
    for hidden in ("Red.", "Name a fruit.", "A pear."):
        assert hidden not in text
    store.select_version(a3.id)  # the other branch, through its first message
    text = store.export.markdown(chat.id)
    assert "## User (version 2 of 2)\n\nName a fruit.\n" in text and "## Assistant\n\nA pear.\n" in text
    assert "Name a colour." not in text and "Blue." not in text


def test_export_json_writes_the_whole_tree(store, branched):
    chat, (u1, a1, a2, u1b, a3) = branched
    exported = store.export.json(chat.id)
    assert json.loads(json.dumps(exported)) == exported
    assert [(m["id"], m["parent_id"], m["text"]) for m in exported["messages"]] == [
        (u1.id, None, "Name a colour."),
        (a1.id, u1.id, "Red."),
        (a2.id, u1.id, "Blue."),
        (u1b.id, None, "Name a fruit."),
        (a3.id, u1b.id, "A pear."),
    ]
    assert exported["visible_thread"] == [u1.id, a2.id]


def _png(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 3), colour).save(out, "PNG")
    return out.getvalue()


def test_write_markdown_puts_the_images_beside_it_and_the_links_survive_a_move(store, tmp_path):
    chat = store.create_chat("Two pictures")
    red, blue = store.add_attachment(_png((255, 0, 0)), "png"), store.add_attachment(_png((0, 0, 255)), "png")
    store.add_message(chat.id, "user", "Compare these.", images=[red, blue])
    store.add_message(chat.id, "assistant", "Red and blue.", stats={"new_tokens": 3, "eos_reason": "stop_token"})
    first = tmp_path / "exports" / "My chat.md"
    first.parent.mkdir()
    assert store.export.write_markdown(chat.id, first) == first
    shared = tmp_path / "elsewhere"
    shutil.copytree(first.parent, shared)  # as a reader who was sent the folder gets it
    shutil.rmtree(first.parent)
    text = (shared / "My chat.md").read_text(encoding="utf-8")
    assert "file:" not in text and str(tmp_path) not in text and "eos_reason" not in text
    links = re.findall(r"!\[image (\d)\]\(([^)]+)\)", text)
    assert [number for number, _ in links] == ["1", "2"]
    for (_, link), colour in zip(links, [(255, 0, 0), (0, 0, 255)]):
        image = shared / unquote(link)
        assert image.parent.name == "My chat_images"
        with Image.open(image) as opened:
            assert opened.format == "PNG" and opened.getpixel((0, 0)) == colour

    with_stats = store.export.write_markdown(chat.id, shared / "stats.md", include_stats=True)
    assert "*new_tokens: 3, eos_reason: stop_token*" in with_stats.read_text(encoding="utf-8")
    assert sorted(p.name for p in (shared / "stats_images").iterdir()) == sorted([f"{red}.png", f"{blue}.png"])


def test_write_markdown_without_images_makes_no_folder_and_reports_an_unwritable_path(store, tmp_path):
    chat = store.create_chat("Words only")
    store.add_message(chat.id, "user", "Hello")
    store.export.write_markdown(chat.id, tmp_path / "words.md")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("words")) == ["words.md"]
    with pytest.raises(OSError):
        store.export.write_markdown(chat.id, tmp_path / "missing" / "words.md")
