"""What a parser finds in an answer: tool calls whole (ToolCall) and as they stream (CallDelta, ToolDelta).

A call's `arguments` is the JSON text the model wrote, as OpenAI's API returns it; the argument fragments a
stream gives, joined, are exactly that text.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Any

_ALPHANUMERIC = string.ascii_letters + string.digits


def new_call_id(style: str = "openai") -> str:
    """A fresh call id: "call_" and 24 hex digits, or (style "mistral") the 9 letters and digits Mistral's
    templates insist on."""
    if style == "mistral":
        return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolCall:
    """One call: its id, the function's name and the arguments' JSON text."""

    id: str
    name: str
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        """As an assistant message's `tool_calls` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class CallDelta:
    """New text of call `index`: its first delta has the id and name, later ones argument fragments only."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        """As a streamed `delta.tool_calls` entry."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


@dataclass
class ToolDelta:
    """What one piece of streamed text adds: answer text for the user, and call deltas (one per call touched,
    in order)."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)

    def extend(self, other: ToolDelta) -> ToolDelta:
        self.content += other.content
        for delta in other.calls:
            self.add(delta)
        return self

    def add(self, delta: CallDelta) -> None:
        """Append `delta`, merged into the last one when it continues the same call."""
        last = self.calls[-1] if self.calls else None
        if last is not None and last.index == delta.index and delta.id is None:
            self.calls[-1] = CallDelta(last.index, last.id, last.name, last.arguments + delta.arguments)
        elif delta.id is not None or delta.arguments:
            self.calls.append(delta)
