"""What a conversation's documents put into its prompt, and how much room they may take.

A document that fitted the context when it was sent (counted with the model's tokenizer, leaving room for the
chat and the answer: `room_for_documents`) goes into its own user message whole, every turn, so the prompt's
beginning stays the same and the engine's prefix cache keeps it:

    <document name="notes.md">
    ...its text...
    </document>

    the user's own text

A larger one was cut into passages and indexed (app/store/documents.py). For each question, the passages that
best match the latest user message go into that message, in reading order, within the budget the documents got
when sent less what the chat has grown since (one passage at least); the message that carried the document says
where its passages are.
The answer keeps which passages it was given (`PromptDocuments.sources`, saved in its stats) to show them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.documents.passages import MAX_PASSAGE_TOKENS

UNKNOWN_CONTEXT = 8192  # a server that does not say its context: assume a common one
WRAPPER_TOKENS = 32  # the tags around a document or passage, and a count that differs a little from the estimate
CHARS_PER_TOKEN_GUESS = 3.0  # for text not counted: errs towards more tokens, so an estimate never overfills
MAX_PASSAGES = 16  # passages given for one question: more is a needle in a haystack again
SNIPPET_CHARS = 400  # of each passage kept with the answer, to show under it
ONE_PASSAGE = MAX_PASSAGE_TOKENS + WRAPPER_TOKENS  # room for the largest passage
PAGE_MARK_TOKENS = 6  # "[p. 123]" and its line breaks, before each page of a whole PDF


def estimate_tokens(text: str) -> int:
    """A text's tokens guessed from its length (no tokenizer at hand)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN_GUESS)


def room_for_documents(context_length: int, used_tokens: int | None, max_new_tokens: int) -> int:
    """Tokens the documents of a message being sent may take: the context less the conversation so far (the
    message itself included), the answer (its token limit, up to a quarter of the context) and a margin."""
    context = context_length or UNKNOWN_CONTEXT
    reserve = min(max_new_tokens, context // 4)
    margin = context // 16 + WRAPPER_TOKENS
    return max(0, context - (used_tokens or 0) - reserve - margin)


def whole_tokens(num_tokens: int, num_pages: int | None) -> int:
    """The tokens a document takes whole in a prompt: its text, its tags, a PDF's page marks."""
    return num_tokens + WRAPPER_TOKENS + PAGE_MARK_TOKENS * (num_pages or 0)


def retrieval_budget(left: int) -> int:
    """The passages' share of the room the whole documents left: half, the other half for the chat to grow, but
    at least one passage of the largest size where the room holds one (a small context)."""
    return max(0, left // 2, min(left, ONE_PASSAGE))


@dataclass
class PromptDocuments:
    """The document blocks of a conversation's user messages (by message id) and the answer's sources."""

    blocks: dict[int, str] = field(default_factory=dict)
    sources: list[dict[str, str]] = field(default_factory=list)

    def text_of(self, message: Any) -> str:
        """The message's text as the model reads it: its documents' blocks, then what the user wrote."""
        block = self.blocks.get(message.id)
        if not block:
            return message.text
        return f"{block}\n\n{message.text}" if message.text else block


def _attribute(value: str) -> str:
    return " ".join(str(value).replace('"', "'").split())


def whole_block(document: Any, passages: Sequence[Any]) -> str:
    """A whole document between tags; a PDF's pages marked ("[p. 3]") so the answer can cite them."""
    parts, page = [], None
    for passage in passages:
        if document.kind == "pdf" and passage.where != page:
            page = passage.where
            parts.append(f"[{page}]")
        parts.append(passage.text)
    pages = f' pages="{document.num_pages}"' if document.num_pages else ""
    body = "\n\n".join(parts)
    return f'<document name="{_attribute(document.name)}"{pages}>\n{body}\n</document>'


def marker_block(document: Any) -> str:
    return (
        f'<document name="{_attribute(document.name)}">(too long to include whole; the passages that best match '
        "the latest question are given with it)</document>"
    )


def passages_block(passages: Sequence[Any], names: dict[int, str]) -> str:
    """The chosen passages, by document, each with where it is."""
    parts = []
    for document_id in dict.fromkeys(p.document_id for p in passages):
        inner = [
            f'<passage where="{_attribute(p.where)}">\n{p.text}\n</passage>'
            for p in passages
            if p.document_id == document_id
        ]
        parts.append(
            f'<document name="{_attribute(names[document_id])}" part="the passages that best match the question; '
            'the whole document is too long to include">\n' + "\n".join(inner) + "\n</document>"
        )
    return "\n\n".join(parts)


def choose_passages(ranked: Sequence[Any], budget: int) -> list[Any]:
    """The best passages that fit `budget` tokens together (at most MAX_PASSAGES), in reading order."""
    chosen, used = [], 0
    for passage in ranked:
        if len(chosen) == MAX_PASSAGES:
            break
        if used + passage.num_tokens + WRAPPER_TOKENS <= budget:
            chosen.append(passage)
            used += passage.num_tokens + WRAPPER_TOKENS
    return sorted(chosen, key=lambda p: (p.document_id, p.position))


def snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1].rstrip() + "…"


def prompt_documents(store: Any, thread: Sequence[Any]) -> PromptDocuments:
    """The blocks the documents of `thread` (a chat's messages, in prompt order) add to its user messages, and
    the sources of the answer to its last user message."""
    documents = getattr(store, "documents", None)
    users = [m for m in thread if m.role == "user"]
    found = documents.of_messages([m.id for m in users]) if documents is not None and users else {}
    if not found:
        return PromptDocuments()
    question = users[-1]
    result = PromptDocuments()
    searched = []  # (index in the thread of the message that carried it, document) of those given by passages
    for index, message in enumerate(thread):
        parts = []
        for document in found.get(message.id, []) if message.role == "user" else ():
            if document.whole:
                parts.append(whole_block(document, documents.passages(document.id)))
                result.sources.append({"document": document.name, "where": "whole"})
            else:
                searched.append((index, document))
                if message is not question:
                    parts.append(marker_block(document))
        if parts:
            result.blocks[message.id] = "\n\n".join(parts)
    if searched:
        chosen = choose_passages(
            documents.search([d.id for _, d in searched], question.text), _budget_now(thread, searched, found)
        )
        names = {d.id: d.name for _, d in searched}
        # no passage fits: the question's own documents are still named, as earlier messages' are
        unfit = [marker_block(d) for i, d in searched if thread[i] is question]
        extra = passages_block(chosen, names) if chosen else "\n\n".join(unfit)
        before = result.blocks.get(question.id)
        if extra:
            result.blocks[question.id] = f"{before}\n\n{extra}" if before else extra
        result.sources += [
            {"document": names[p.document_id], "where": p.where, "text": snippet(p.text)} for p in chosen
        ]
    return result


def _budget_now(thread: Sequence[Any], searched: list[tuple[int, Any]], found: dict[int, list[Any]]) -> int:
    """The passages' budget when their documents were sent, less what the chat grew after the last of them; never
    less than one passage where the budget held one (the overflow policy makes room, or says the chat is full)."""
    last = searched[-1][0]
    grown = 0
    for message in thread[last + 1 :]:
        grown += estimate_tokens(message.text)
        grown += sum(whole_tokens(d.num_tokens, d.num_pages) for d in found.get(message.id, []) if d.whole)
    budget = max(d.budget for _, d in searched)
    return max(min(budget, ONE_PASSAGE), budget - grown)
