"""A document attached to the next message: read, measured in the model's tokens and cut into passages when it is
attached (on a worker thread), then stored with the message when it is sent, whole or by passages as it fits.

    attach   prepare_document(path, count, context_length)   extract.py, one token count, passages.py
    send     keep_documents(store, message_id, documents, room)   the fit decided, rows stored, chips' stats
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.documents.extract import read_document
from app.documents.passages import Passage, cut_passages
from app.documents.prompt import estimate_tokens, retrieval_budget, whole_tokens

log = logging.getLogger(__name__)

Counter = Callable[[str], "int | None"]
EXACT_CHARS = 64_000  # counted whole up to this size, or up to what could fit the context; beyond, from a sample
CHARS_PER_CONTEXT_TOKEN = 12  # no tokenizer packs more characters into a token than this: longer cannot fit


@dataclass(frozen=True)
class AttachedDocument:
    """A document read and cut, waiting to be sent: what the attachment strip shows and the store keeps."""

    name: str
    kind: str  # "txt", "md", "pdf", "docx"
    sha256: str
    num_pages: int | None
    num_tokens: int
    counted: bool  # measured with the loaded model's tokenizer (else estimated from its length)
    passages: tuple[Passage, ...]
    notes: tuple[str, ...] = ()  # what was left out (scanned pages), for the user


def token_counter(backend: Any) -> Counter | None:
    """A function counting a text's tokens with the backend's model (the chat template's turn around it left
    out); it may block, so call it on a worker. None with no model loaded."""
    if not getattr(backend, "is_loaded", False):
        return None

    def count(text: str) -> int | None:
        try:
            full = backend.count_tokens([{"role": "user", "content": text}])
            empty = backend.count_tokens([{"role": "user", "content": ""}])
        except Exception as e:  # a model swapped meanwhile, a template that fails: the length's estimate serves
            log.info("a document's tokens were estimated: %s", e)
            return None
        return None if full is None or empty is None else max(0, int(full) - int(empty))

    return count


def _measure(text: str, count: Counter | None, context_length: int) -> tuple[int, bool]:
    """(tokens, counted): the whole text counted where it might fit the context; a text that cannot is counted
    from its first EXACT_CHARS characters and scaled, which sizes its passages as well (and takes a fraction of
    the time a whole book would)."""
    if count is None:
        return estimate_tokens(text), False
    exact_up_to = max(EXACT_CHARS, CHARS_PER_CONTEXT_TOKEN * context_length)
    sample = text if len(text) <= exact_up_to else text[:EXACT_CHARS]
    tokens = count(sample)
    if tokens is None:
        return estimate_tokens(text), False
    if sample is not text:
        tokens = math.ceil(tokens * len(text) / max(1, len(sample)))
    return max(1, tokens), True


def prepare_document(path: str | Path, count: Counter | None = None, context_length: int = 0) -> AttachedDocument:
    """Read a document (`DocumentError` when it cannot be attached), count its tokens with `count` (the model's
    tokenizer, `token_counter`; None: estimated) and cut it into passages. Blocking: run it on a worker."""
    extracted = read_document(path)
    text = "\n\n".join(s.text for s in extracted.sections)
    num_tokens, counted = _measure(text, count, context_length)
    passages = cut_passages(extracted.sections, len(text) / num_tokens, paged=extracted.kind == "pdf")
    return AttachedDocument(
        extracted.name,
        extracted.kind,
        extracted.sha256,
        extracted.num_pages,
        num_tokens,
        counted,
        tuple(passages),
        extracted.notes,
    )


def summary(document: AttachedDocument | Mapping[str, Any]) -> str:
    """ "12 pages, 3.4k tokens": a document's size for its chip."""
    pages = document["pages"] if isinstance(document, Mapping) else document.num_pages
    tokens = document["tokens"] if isinstance(document, Mapping) else document.num_tokens
    size = f"{tokens / 1000:.1f}k tokens" if tokens >= 1000 else f"{tokens} tokens"
    return f"{pages} page{'s' if pages != 1 else ''}, {size}" if pages else size


def keep_documents(store: Any, message_id: int, documents: Sequence[AttachedDocument], room: int) -> list[dict]:
    """Store `documents` with message `message_id`: each goes into prompts whole while it fits the `room` left
    in the context (app.documents.prompt.room_for_documents), else by its passages that best match each
    question, within what room remains. Returns the message's chips (for its stats: name, kind, pages, tokens,
    whole). StoreError when the store refuses; documents stored before it stay (the caller drops the message)."""
    wholes, left = [], room
    for document in documents:  # in the order attached: the first ones go whole while they fit
        cost = whole_tokens(document.num_tokens, document.num_pages)
        wholes.append(cost <= left)
        left -= cost if wholes[-1] else 0
    budget = retrieval_budget(left)
    chips = []
    for position, (document, whole) in enumerate(zip(documents, wholes, strict=True)):
        store.documents.add(
            message_id,
            position,
            name=document.name,
            kind=document.kind,
            sha256=document.sha256,
            num_pages=document.num_pages,
            num_tokens=document.num_tokens,
            whole=whole,
            budget=0 if whole else budget,
            passages=[(p.where, p.text, p.num_tokens) for p in document.passages],
        )
        chip = {"name": document.name, "kind": document.kind, "pages": document.num_pages}
        chips.append({**chip, "tokens": document.num_tokens, "whole": whole})
    return chips
