"""What documents put into the prompt, on a real store: a document that fits goes whole into its message; a long
one is cut, indexed, and each question gets the passages that match it, within the budget; sources say which."""

from __future__ import annotations

import re

import pytest

from app.documents.attach import keep_documents, prepare_document
from app.documents.prompt import (
    WRAPPER_TOKENS,
    estimate_tokens,
    prompt_documents,
    retrieval_budget,
    room_for_documents,
    whole_tokens,
)
from app.store import Store
from app.ui.chat_answer import conversation, conversation_sources


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    with Store(tmp_path / "tandem.sqlite3") as opened:
        yield opened


def send(store: Store, chat_id: int, text: str, documents=(), room: int = 0) -> int:
    message = store.add_message(chat_id, "user", text)
    if documents:
        chips = keep_documents(store, message.id, documents, room)
        store.update_message(message.id, stats={"documents": chips})
    return message.id


def test_room_leaves_space_for_the_chat_and_the_answer():
    assert room_for_documents(8192, 1000, 512) == 8192 - 1000 - 512 - (512 + WRAPPER_TOKENS)
    assert room_for_documents(8192, None, 100_000) == 8192 - 2048 - (512 + WRAPPER_TOKENS)  # a quarter at most
    assert room_for_documents(0, 0, 0) == 8192 - (512 + WRAPPER_TOKENS)  # a server that does not say its context
    assert room_for_documents(1024, 5000, 16) == 0


def test_a_document_that_fits_goes_whole_into_its_message(store, tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("# Plan\n\nBuy rope.\n\nFix the lamp.\n")
    document = prepare_document(path)
    chat = store.create_chat("c")
    send(store, chat.id, "What is the plan?", [document], room=10_000)
    messages, _ = conversation(store, chat.id, see_images=False)
    assert messages == [
        {
            "role": "user",
            "content": '<document name="notes.md">\n# Plan\n\nBuy rope.\n\nFix the lamp.\n</document>\n\nWhat is the plan?',
        }
    ]
    assert conversation_sources(store, chat.id) == [{"document": "notes.md", "where": "whole"}]
    # later turns carry it the same way, so the prompt's beginning (and the engine's prefix cache) stays
    store.add_message(chat.id, "assistant", "Rope and the lamp.")
    send(store, chat.id, "Anything else?")
    assert conversation(store, chat.id, see_images=False)[0][0] == messages[0]


def test_a_whole_pdf_marks_its_pages(store, tmp_path, makers):
    path = tmp_path / "story.pdf"
    path.write_bytes(makers.make(["Page one.", None, "Page three."]))
    chat = store.create_chat("c")
    send(store, chat.id, "", [prepare_document(path)], room=10_000)
    (message,), _ = conversation(store, chat.id, see_images=False)
    assert (
        message["content"]
        == '<document name="story.pdf" pages="3">\n[p. 1]\n\nPage one.\n\n[p. 3]\n\nPage three.\n</document>'
    )


def test_a_long_document_gives_each_question_its_best_passages_within_the_budget(store, tmp_path, makers):
    path = tmp_path / "big.txt"
    path.write_text(makers.long_text(300, {57: "the zebra crossing is painted blue", 201: "a walrus named Olga"}))
    document = prepare_document(path)
    assert len(document.passages) > 50
    chat = store.create_chat("c")
    room = 2000
    first = send(store, chat.id, "What colour is the zebra crossing?", [document], room=room)
    (record,) = store.documents.of_messages([first])[first]
    assert not record.whole and record.budget == room // 2

    messages, _ = conversation(store, chat.id, see_images=False)
    content = messages[0]["content"]
    assert content.endswith("</document>\n\nWhat colour is the zebra crossing?")
    assert "the zebra crossing is painted blue" in content and "walrus" not in content
    given = re.findall(r'<passage where="(§\d+)">\n(.*?)\n</passage>', content, re.S)
    assert 1 <= len(given) and sum(estimate_tokens(text) for _, text in given) <= record.budget
    sources = conversation_sources(store, chat.id)
    assert [s["where"] for s in sources] == [where for where, _ in given]
    assert all(s["document"] == "big.txt" and s["text"] for s in sources)
    zebra = next(s for s in sources if "zebra" in s["text"])
    assert zebra["where"] == next(p.where for p in document.passages if "zebra" in p.text)

    # A follow-up: its own passages; the first message now only names the document.
    store.add_message(chat.id, "assistant", "Blue.")
    send(store, chat.id, "Who is the walrus?")
    messages, _ = conversation(store, chat.id, see_images=False)
    assert messages[0]["content"].startswith('<document name="big.txt">(too long to include whole')
    assert "zebra crossing is painted" not in messages[0]["content"]
    assert "a walrus named Olga" in messages[2]["content"]
    assert [s["where"] for s in conversation_sources(store, chat.id)] != [w for w, _ in given]
    # the question being answered again (regenerate) is the first one: its passages again
    assert conversation_sources(store, chat.id, before=store.messages(chat.id)[1].id) == sources


def test_the_budget_shrinks_as_the_chat_grows(store, tmp_path, makers):
    path = tmp_path / "big.txt"
    path.write_text(makers.long_text(300))
    chat = store.create_chat("c")
    send(store, chat.id, "river", [prepare_document(path)], room=4000)
    num_given = []  # passages given to each question, as long answers fill the context
    for turn in range(4):
        store.add_message(chat.id, "assistant", "stone " * 300)
        send(store, chat.id, f"question {turn} about the river")
        num_given.append(len(prompt_documents(store, store.messages(chat.id)).sources))
    assert num_given == sorted(num_given, reverse=True) and num_given[-1] < num_given[0]


def test_documents_go_whole_in_the_order_attached_while_they_fit(store, tmp_path):
    paths = []
    for name in ("a.txt", "b.txt"):
        paths.append(tmp_path / name)
        paths[-1].write_text(f"{name} says hello. " * 40)
    first, second = (prepare_document(path) for path in paths)
    cost = whole_tokens(first.num_tokens, None)
    chat = store.create_chat("c")
    message_id = send(store, chat.id, "Compare them.", [first, second], room=2 * cost - 1)
    records = store.documents.of_messages([message_id])[message_id]
    assert [(r.name, r.whole) for r in records] == [("a.txt", True), ("b.txt", False)]
    assert records[1].budget == retrieval_budget(cost - 1)
    chips = store.messages(chat.id)[0].stats["documents"]
    assert [(c["name"], c["whole"], c["tokens"]) for c in chips] == [
        ("a.txt", True, first.num_tokens),
        ("b.txt", False, second.num_tokens),
    ]
