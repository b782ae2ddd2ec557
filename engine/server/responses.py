"""OpenAI's reply shapes for chat completions and (legacy) completions: whole bodies and streamed chunks.

Both endpoints share one flow (app.py); a format object is the only thing that differs between them.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from engine.server.results import Piece, TokenLogprob, finish_reason, usage
from engine.tools.stream import ToolCallParser


class ChatFormat:
    """`chat.completion` bodies and `chat.completion.chunk` stream events. With `tools` (the parser reading the
    job's answer, which `pieces` feeds) the content is what it left of the answer, and its calls come as
    `tool_calls` with finish reason "tool_calls"."""

    def __init__(self, model: str, logprobs: bool, tools: ToolCallParser | None = None):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.logprobs = logprobs
        self.tools = tools

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return {"content": [_chat_logprob(e) for e in entries], "refusal": None}

    def body(self, entries: list[TokenLogprob], final: dict[str, Any]) -> dict[str, Any]:
        content = final.get("full_answer", final["full_completion"])
        calls = self.tools.calls if self.tools is not None else []
        if self.tools is not None:
            content = self.tools.content.strip() if calls else self.tools.content
        message = {"role": "assistant", "content": content or (None if calls else content), "refusal": None}
        if "full_reasoning" in final:  # a reasoning model: its thinking apart, as vLLM and DeepSeek's API send it
            message["reasoning_content"] = final["full_reasoning"] or None
        if calls:
            message["tool_calls"] = [call.openai() for call in calls]
        choice = {
            "index": 0,
            "message": message,
            "logprobs": self._logprobs(entries),
            "finish_reason": finish_reason(final, bool(calls)),
        }
        return {**self._head("chat.completion"), "choices": [choice], "usage": usage(final)}

    def first_chunk(self, include_usage: bool) -> dict[str, Any] | None:
        delta = {"role": "assistant", "content": ""}
        return self._chunk(delta, None, None, include_usage)

    def chunk(self, piece: Piece, include_usage: bool) -> dict[str, Any] | None:
        quiet = not piece.text and not piece.reasoning and not piece.tool_calls and not piece.logprobs
        if quiet and piece.final is None:
            return None
        called = self.tools is not None and bool(self.tools.calls)
        reason = finish_reason(piece.final, called) if piece.final is not None else None
        delta: dict[str, Any] = {"reasoning_content": piece.reasoning} if piece.reasoning else {}
        if piece.text or (piece.final is None and not piece.reasoning and not piece.tool_calls):
            delta["content"] = piece.text
        if piece.tool_calls:
            delta["tool_calls"] = [call.openai() for call in piece.tool_calls]
        return self._chunk(delta, self._logprobs(piece.logprobs), reason, include_usage)

    def _chunk(self, delta: dict, logprobs: Any, reason: str | None, include_usage: bool) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        head = self._head("chat.completion.chunk")
        return {**head, "choices": [choice], **({"usage": None} if include_usage else {})}

    def usage_chunk(self, final: dict[str, Any]) -> dict[str, Any]:
        return {**self._head("chat.completion.chunk"), "choices": [], "usage": usage(final)}


class CompletionFormat:
    """`text_completion` bodies and stream events."""

    def __init__(self, model: str, logprobs: bool):
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.logprobs = logprobs
        self._offset = 0  # characters of completion text before the next piece (for text_offset)

    def _head(self) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}

    def _logprobs(self, entries: list[TokenLogprob], offset: int) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        offsets = []
        for e in entries:
            offsets.append(offset)
            offset += len(e.text)
        return {
            "tokens": [e.text for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{text: lp for text, _, lp in e.top} for e in entries],
            "text_offset": offsets,
        }

    def _choice(self, text: str, entries: list[TokenLogprob], reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": self._logprobs(entries, self._offset), "finish_reason": reason}
        self._offset += len(text)
        return choice

    def body(self, entries: list[TokenLogprob], final: dict[str, Any]) -> dict[str, Any]:
        choice = self._choice(final["full_completion"], entries, finish_reason(final))
        return {**self._head(), "choices": [choice], "usage": usage(final)}

    def first_chunk(self, include_usage: bool) -> dict[str, Any] | None:
        return None  # completions have no role chunk

    def chunk(self, piece: Piece, include_usage: bool) -> dict[str, Any] | None:
        if not piece.text and not piece.logprobs and piece.final is None:
            return None
        reason = finish_reason(piece.final) if piece.final is not None else None
        choice = self._choice(piece.text, piece.logprobs, reason)
        return {**self._head(), "choices": [choice], **({"usage": None} if include_usage else {})}

    def usage_chunk(self, final: dict[str, Any]) -> dict[str, Any]:
        return {**self._head(), "choices": [], "usage": usage(final)}


def _chat_logprob(e: TokenLogprob) -> dict[str, Any]:
    return {
        "token": e.text,
        "logprob": e.logprob,
        "bytes": list(e.data),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(b)} for t, b, lp in e.top],
    }
