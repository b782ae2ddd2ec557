"""A message's document chips and an answer's sources, from its stats."""

from __future__ import annotations

from app.ui.message_documents import DocumentsBlock, sources_title
from app.ui.message_view import MessageWidget


def test_the_sources_title_names_places_by_document():
    sources = [{"document": "a.pdf", "where": f"p. {n}", "text": "..."} for n in range(1, 11)]
    sources += [{"document": "notes.md", "where": "whole"}]
    assert sources_title(sources) == "Sources: a.pdf p. 1, p. 2, p. 3, p. 4, p. 5, p. 6, p. 7, p. 8, … · notes.md"


def test_a_message_without_documents_builds_nothing_and_one_with_them_shows_them(qtbot):
    plain = MessageWidget(1, "assistant", "hi", stats={"new_tokens": 3})
    qtbot.addWidget(plain)
    assert plain.documents.sources is None and plain.documents.isHidden() and plain.documents.chip_texts() == []
    user = MessageWidget(
        2, "user", "read this", stats={"documents": [{"name": "a.pdf", "pages": 3, "tokens": 1500, "whole": True}]}
    )
    qtbot.addWidget(user)
    assert user.documents.chip_texts() == ["📄 a.pdf · 3 pages, 1.5k tokens · whole"]
    answer = MessageWidget(3, "assistant", "", stats={})
    qtbot.addWidget(answer)
    sources = [{"document": "a.pdf", "where": "p. 2", "text": "The second page."}]
    answer.set_stats({"sources": sources})  # as the answer begins
    answer.documents.sources.set_open(True)
    answer.set_stats({"sources": sources, "new_tokens": 5})  # as it ends: still open
    assert answer.documents.sources.is_open and answer.documents.sources_text.text() == "a.pdf p. 2: The second page."
    assert isinstance(answer.documents, DocumentsBlock) and "5 tokens" in answer.stats_label.text()
