"""Cutting a document into passages of about PASSAGE_TOKENS tokens: what retrieval indexes, ranks and quotes.

Cuts fall on the largest boundary that makes the pieces small enough, paragraphs first, then lines, then
sentences, then words (a run of characters with no space at all, last, at MAX_PASSAGE_TOKENS), and pieces are
packed back together up to the passage size; a passage never spans two Sections, so each has one place to
cite: "p. 3" for a PDF page, "§12" (its number in the document) otherwise.

Sizes are in tokens of the model's tokenizer, through the document's measured characters per token (one
count of the whole text, app.documents.attach), so a passage is the size the prompt's budget assumes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from app.documents.extract import Section

PASSAGE_TOKENS = 300  # packed up to this size ...
MAX_PASSAGE_TOKENS = 400  # ... and one piece alone up to this
# (boundary, the text that joins two pieces cut there again): paragraphs, lines, sentences, words
_BOUNDARIES = (
    (re.compile(r"\n[ \t]*\n\s*"), "\n\n"),
    (re.compile(r"\n\s*"), "\n"),
    (re.compile(r"(?<=[.!?;:])\s+"), " "),
    (re.compile(r"\s+"), " "),
)


@dataclass(frozen=True)
class Passage:
    """A piece of a document: where it is ("p. 3", "§12"), its text, and its length in tokens."""

    where: str
    text: str
    num_tokens: int


def _pieces(text: str, max_chars: int, level: int = 0, joiner: str = "\n\n") -> list[tuple[str, str]]:
    """(joiner, piece) pairs no longer than `max_chars`, cut at the largest boundary that makes them fit; each
    joiner is the text that stood before its piece (a paragraph break, a line break, a space)."""
    text = text.strip()
    if not text:
        return []
    if len(text) <= max_chars:
        return [(joiner, text)]
    if level == len(_BOUNDARIES):  # no space for max_chars characters: cut it blind
        return [(joiner if i == 0 else "", text[i : i + max_chars]) for i in range(0, len(text), max_chars)]
    pattern, inner = _BOUNDARIES[level]
    parts = pattern.split(text)
    if len(parts) == 1:
        return _pieces(text, max_chars, level + 1, joiner)
    out: list[tuple[str, str]] = []
    for i, part in enumerate(parts):
        out += _pieces(part, max_chars, level + 1, joiner if i == 0 else inner)
    return out


def cut_passages(sections: Iterable[Section], chars_per_token: float, paged: bool) -> list[Passage]:
    """The passages of a document's sections, in reading order; `paged`: a PDF, whose passages cite pages."""
    chars_per_token = max(chars_per_token, 0.5)
    target, limit = int(PASSAGE_TOKENS * chars_per_token), int(MAX_PASSAGE_TOKENS * chars_per_token)
    texts: list[tuple[str, str]] = []  # (the page, or "" for a numbered passage; its text)
    for section in sections:
        current = ""
        for joiner, piece in _pieces(section.text, limit):
            if current and len(current) + len(joiner) + len(piece) > target:
                texts.append((section.where, current))
                current = piece
            else:
                current = current + joiner + piece if current else piece
        if current:
            texts.append((section.where, current))
    passages = []
    for number, (where, text) in enumerate(texts, 1):
        label = where if paged else f"§{number}"
        passages.append(Passage(label, text, max(1, math.ceil(len(text) / chars_per_token))))
    return passages
