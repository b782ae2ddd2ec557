"""Documents in the window, on the real engine (tiny model): attach, chips, what the engine is given, sources
under the answer, and both after a restart; long documents by passage; bad files said, nothing lost.

Bad inputs tried: a PDF of blank pages (no text layer: "scanned"), a PDF locked with a password, a sparse
500 MB .pdf (refused by its size, never read), random bytes named .docx, a file of an unknown kind (.xyz).
"""

from __future__ import annotations

import io

import docx
from pypdf import PdfWriter

from app.store import Store


def spy_on_prompts(engine_service, monkeypatch) -> list[list[dict]]:
    """The messages of every answer the engine is asked for, as given (not the tiny model's text)."""
    received: list[list[dict]] = []
    original = engine_service.start_answer

    async def start_answer(messages, *args, **kwargs):
        received.append([dict(m) for m in messages])
        return await original(messages, *args, **kwargs)

    monkeypatch.setattr(engine_service, "start_answer", start_answer)
    return received


def word_file(path, heading: str, text: str) -> None:
    made = docx.Document()
    made.add_heading(heading, level=1)
    made.add_paragraph(text)
    made.save(path)


def long_text(num_paragraphs: int, marked: dict[int, str]) -> str:
    words = "river stone lantern orchard copper meadow harbor violet thunder saddle quill ember".split()
    paragraphs = []
    for i in range(num_paragraphs):
        line = [words[(i * 7 + j * 3) % len(words)] for j in range(60)]
        line[10:10] = marked.get(i, "").split()
        paragraphs.append(f"Paragraph {i}. " + " ".join(line) + ".")
    return "\n\n".join(paragraphs)


def test_documents_go_to_the_model_and_sources_show_after_a_restart(
    window, engine_service, app_store, run, ui, tmp_path, monkeypatch
):
    received = spy_on_prompts(engine_service, monkeypatch)
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 4))
    notes = tmp_path / "notes.md"
    notes.write_text("# Ship log\n\nThe cargo is forty crates of tea.\n")
    word_file(tmp_path / "crew.docx", "Crew", "The cook is called Ishmael.")
    big = tmp_path / "big.txt"
    big.write_text(long_text(400, {123: "the zebra crossing is painted blue"}))

    async def go():
        await tab.attach_files([str(notes), str(tmp_path / "crew.docx")])
        assert [d.name for d in tab.strip.documents()] == ["notes.md", "crew.docx"] and tab.strip.isVisible()
        assert all(d.counted for d in tab.strip.documents())  # with the loaded model's tokenizer
        tab.input.setPlainText("What is the cargo?")
        assert tab.send()
        await ui.wait_idle(window)
        assert tab.strip.documents() == [] and not tab.strip.isVisible()
        # a long one: by passages, the question's best
        await tab.attach_files([str(big)])
        tab.input.setPlainText("What colour is the zebra crossing?")
        assert tab.send()
        await ui.wait_idle(window)

    run(go())
    first, second = received
    (asked,) = first
    assert asked["role"] == "user" and asked["content"].endswith("What is the cargo?")
    assert (
        '<document name="notes.md">\n# Ship log\n\nThe cargo is forty crates of tea.\n</document>' in asked["content"]
    )
    assert '<document name="crew.docx">\nCrew\n\nThe cook is called Ishmael.\n</document>' in asked["content"]
    assert second[0] == asked  # the whole documents stay in their message, word for word (prefix reuse)
    question = second[-1]["content"]
    assert "the zebra crossing is painted blue" in question and question.endswith("zebra crossing?")
    assert len(question) < len(big.read_text()) // 10  # passages, not the book
    assert "Paragraph 300." not in question

    widgets = tab.message_widgets()
    assert [w.role for w in widgets] == ["user", "assistant"] * 2
    chips = widgets[0].documents.chip_texts()
    assert chips[0].startswith("📄 notes.md · ") and chips[0].endswith(" · whole") and "crew.docx" in chips[1]
    assert widgets[2].documents.chip_texts()[0].endswith("searched by passage")
    assert widgets[1].documents.sources.toggle.text() == "▸ Sources: notes.md · crew.docx"
    zebra = app_store.messages(tab.chat_id)[3].stats["sources"]
    place = next(s["where"] for s in zebra if "zebra" in s.get("text", ""))
    title = widgets[3].documents.sources.toggle.text()  # the whole documents are still in its prompt too
    assert title.startswith("▸ Sources: notes.md · crew.docx · big.txt §") and place in title
    shown_before = [(w.documents.chip_texts(), w.documents.sources.toggle.text()) for w in widgets]
    widgets[3].documents.sources.set_open(True)
    assert "the zebra crossing is painted blue" in widgets[3].documents.sources_text.text()

    # A restart: a new store on the same file and a new window show the same chips and sources.
    chat_id = tab.chat_id
    run(ui.close_window(window))
    with Store(app_store.path) as again:
        reopened = ui.open_window(again, engine_service)
        try:
            shown = reopened.open_chat(chat_id).message_widgets()
            assert [(w.documents.chip_texts(), w.documents.sources.toggle.text()) for w in shown] == shown_before
            assert shown[3].documents.sources.isVisibleTo(shown[3]) and title in shown_before[3][1]
        finally:
            run(ui.close_window(reopened))


def test_bad_files_are_said_in_the_chat_and_nothing_is_lost(window, engine_service, app_store, run, ui, tmp_path):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 4))
    scanned, locked = PdfWriter(), PdfWriter()
    scanned.add_blank_page(612, 792)
    locked.add_blank_page(612, 792)
    locked.encrypt(user_password="secret", owner_password="owner", algorithm="AES-128")
    for name, writer in {"scan.pdf": scanned, "locked.pdf": locked}.items():
        out = io.BytesIO()
        writer.write(out)
        (tmp_path / name).write_bytes(out.getvalue())
    with open(tmp_path / "huge.pdf", "wb") as handle:
        handle.truncate(500 * 2**20)  # sparse: nothing written
    (tmp_path / "broken.docx").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "data.xyz").write_bytes(b"\x00\x01 not anything")
    expected = {
        "scan.pdf": "scan.pdf: this PDF has no text layer; it looks scanned, and Tandem does not read images of text yet",
        "locked.pdf": "locked.pdf is locked with a password",
        "huge.pdf": "huge.pdf is 500 MB; Tandem reads documents up to 64 MB",
        "broken.docx": "broken.docx is not a readable Word document",
        "data.xyz": "data.xyz is not a file Tandem can attach",
    }

    async def go():
        tab.input.setPlainText("Before the bad files")
        assert tab.send()
        await ui.wait_idle(window)
        await tab.attach_files([str(tmp_path / name) for name in expected])
        notice = tab.notice_text()
        for words in expected.values():
            assert words in notice
        assert tab.strip.documents() == [] and tab.strip.attachments() == []
        tab.input.setPlainText("Still working?")
        assert tab.send()
        await ui.wait_idle(window)

    run(go())
    assert [m.text for m in app_store.messages(tab.chat_id) if m.role == "user"] == [
        "Before the bad files",
        "Still working?",
    ]
    assert all(m.complete for m in app_store.messages(tab.chat_id))
