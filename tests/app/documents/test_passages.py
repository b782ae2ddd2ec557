"""Cutting documents into passages: sizes in tokens, cuts on the largest boundary that fits, nothing lost."""

from __future__ import annotations

import math

from app.documents.extract import Section
from app.documents.passages import MAX_PASSAGE_TOKENS, PASSAGE_TOKENS, cut_passages


def words(text: str) -> list[str]:
    return text.split()


def test_paragraphs_are_packed_whole_up_to_the_passage_size(makers):
    text = makers.long_text(40)
    paragraphs = text.split("\n\n")
    passages = cut_passages([Section("", text)], chars_per_token=4.0, paged=False)
    assert [p.where for p in passages] == [f"§{i}" for i in range(1, len(passages) + 1)]
    for passage in passages:
        assert passage.num_tokens <= MAX_PASSAGE_TOKENS and passage.num_tokens == math.ceil(len(passage.text) / 4)
        # each passage is whole paragraphs, as written
        assert all(part in paragraphs for part in passage.text.split("\n\n"))
    assert sum(len(p.text.split("\n\n")) for p in passages) == len(paragraphs)
    assert max(p.num_tokens for p in passages) > PASSAGE_TOKENS // 2  # packed, not one paragraph each


def test_a_long_paragraph_is_cut_at_sentences_then_words_then_blindly():
    sentence = "The keeper trims the wick and watches the sea. "
    no_spaces = "x" * 5000
    text = sentence * 200 + "\n\n" + no_spaces
    passages = cut_passages([Section("p. 7", text)], chars_per_token=2.0, paged=True)
    assert {p.where for p in passages} == {"p. 7"}
    assert all(len(p.text) <= MAX_PASSAGE_TOKENS * 2 for p in passages)
    sentences = [p for p in passages if "keeper" in p.text]
    assert all(p.text.endswith("sea.") for p in sentences)  # cut between sentences
    assert words(" ".join(p.text for p in passages)).count("keeper") == 200  # nothing lost
    assert "".join(p.text for p in passages if "x" in p.text) == no_spaces


def test_passages_never_span_sections_and_cite_their_page():
    sections = [Section("p. 1", "First page."), Section("p. 2", "Second page."), Section("p. 3", "Third.")]
    passages = cut_passages(sections, chars_per_token=4.0, paged=True)
    assert [(p.where, p.text) for p in passages] == [
        ("p. 1", "First page."),
        ("p. 2", "Second page."),
        ("p. 3", "Third."),
    ]
