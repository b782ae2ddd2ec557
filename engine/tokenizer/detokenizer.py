"""Streaming detokenization: text as tokens arrive, never half a UTF-8 character.

Decoding one token at a time goes wrong in three ways: a character split over byte tokens (<0xE2>
<0x9C> <0x85>, or byte-level BPE pieces) decodes to U+FFFD; sentencepiece's "▁" is dropped at the start
of every decode call; and decoders can depend on neighbouring tokens. So each step decodes a small
window that starts with tokens already shown (the context) and emits what the new tokens add:

    ids:    ... | context (already shown) | pending (new since the last clean boundary) |
                ^ window start            ^ context_end
    emit:   decode(context + pending) minus decode(context), without trailing U+FFFD

When the window's text ends on a whole character, the pending tokens become the next context and the
window slides forward, so each step decodes only a few tokens. Every emitted piece, concatenated,
equals `tokenizer.decode(all ids)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.tokenizer.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class StreamingDetokenizer:
    """Turns a stream of token ids into text chunks for one sequence.

    `add(token_id)` returns the newly completed text (possibly ""); `flush()` returns what is still
    held back (an incomplete trailing character) once the sequence ends. Special tokens are left out
    unless `decode_special_tokens`, ids outside the vocabulary (image tokens) always.
    """

    def __init__(self, tokenizer: Tokenizer, decode_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.decode_special_tokens = decode_special_tokens
        self._skip = frozenset() if decode_special_tokens else frozenset(tokenizer.special_token_ids)
        self._reset()

    def _reset(self) -> None:
        self._ids: list[int] = []  # the window only: tokens before it are dropped
        self._context_end = 0  # ids[:_context_end] is shown context
        self._context_text = ""  # decode(ids[:_context_end])
        self._sent = 0  # characters already emitted beyond the context (while a character is incomplete)

    def add(self, token_id: int) -> str:
        """Take the next token; return the text it completes."""
        token_id = int(token_id)
        if not 0 <= token_id < self.tokenizer.vocab_size or token_id in self._skip:
            return ""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return any text still held back (only an incomplete character can be) and start afresh."""
        out = self._advance(final=True)
        self._reset()
        return out

    def _advance(self, final: bool) -> str:
        text = self._decode(0, len(self._ids))
        complete = text if final else text.rstrip(_REPLACEMENT)
        # the window's text starts with the context's text: decoders only ever append to a text
        skip = len(self._context_text) + self._sent
        new = complete[skip:]
        self._sent += len(new)
        if len(complete) == len(text):
            # a clean boundary: the pending tokens become the context of the next window
            del self._ids[: self._context_end]
            self._context_end = len(self._ids)
            self._context_text = self._decode(0, self._context_end)
            self._sent = 0
        return new

    def _decode(self, begin: int, end: int) -> str:
        return self.tokenizer.decode(self._ids[begin:end], decode_special_tokens=True)
