"""ToolRequest: the tools one answer may call, as any Backend takes them (`start_answer(..., tools=...)`).

The definitions are OpenAI's `tools` entries (app.tools.ToolBox.definitions gives them); `choice` is OpenAI's
`tool_choice` ("auto", "none", "required", or {"type": "function", "function": {"name": ...}}); `parallel` lets
one answer hold several calls. The local engine turns them into its call syntax and grammar
(app.service.local_tools); a remote backend sends them as they are. An answer's calls come back on its last
AnswerChunk, under "tool_calls", as OpenAI's `tool_calls` list (id, type, function name and JSON arguments).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[Mapping[str, Any], ...]
    choice: str | Mapping[str, Any] = "auto"
    parallel: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(self.tools))

    @classmethod
    def of(cls, tools: Sequence[Mapping[str, Any]], choice: str | Mapping[str, Any] = "auto") -> ToolRequest | None:
        """A request for `tools`, or None when there are none (an answer without tools)."""
        return cls(tuple(tools), choice) if tools else None
