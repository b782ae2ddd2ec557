"""Calls as JSON objects between tags: Hermes and Qwen (2.5, 3) write

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, a newline between blocks; Phi-4-mini writes `<|tool_call|>{...}<|/tool_call|>`. Text may come
before the first block. The Hermes form is also the generic one, for a model whose template knows no tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.harmony import held_suffix
from engine.tools.family import ToolFamily
from engine.tools.grammar import GrammarBuilder, call_object
from engine.tools.jsonscan import JsonCallBody
from engine.tools.schema import Tool
from engine.tools.stream import ToolCallParser


class TaggedJsonParser(ToolCallParser):
    """Content until `start`, a JSON call object until `end`, and so on."""

    def __init__(self, start: str, end: str, id_style: str = "openai"):
        super().__init__(id_style)
        self._start, self._end_tag = start, end
        self._body: JsonCallBody | None = None

    def _read(self, text: str) -> None:
        while text:
            if self._body is None:
                at = text.find(self._start)
                if at < 0:
                    keep = held_suffix(text, (self._start,))
                    self._text(text[: len(text) - keep])
                    self._held = text[len(text) - keep :]
                    return
                self._text(text[:at])
                self._body = JsonCallBody()
                text = text[at + len(self._start) :]
                continue
            at = text.find(self._end_tag)
            upto = at if at >= 0 else len(text) - held_suffix(text, (self._end_tag,))
            self._take(self._body.feed(text[:upto]))
            if at < 0:
                self._held = text[upto:]
                return
            self._end_body(self._body, self._start + self._body.text + self._body.rest + self._end_tag)
            self._body = None
            text = text[at + len(self._end_tag) :]

    def _end(self) -> None:
        held, self._held = self._held, ""
        if self._body is None:
            self._text(held)
            return
        self._take(self._body.feed(held))
        self._end_body(self._body, self._start + self._body.text + self._body.rest)
        self._body = None


@dataclass(frozen=True)
class Hermes(ToolFamily):
    name: ClassVar[str] = "hermes"
    start: ClassVar[str] = "<tool_call>"
    end: ClassVar[str] = "</tool_call>"
    separator: ClassVar[str] = "\n"
    markers: ClassVar[tuple[str, ...]] = ("<tool_call>", "</tool_call>")
    newlines: ClassVar[bool] = True  # a newline inside the tags, around the object

    def parser(self, prompt_text: str = "") -> ToolCallParser:
        return TaggedJsonParser(self.start, self.end, self.id_style)

    def call_body(self, g: GrammarBuilder, tools: Sequence[Tool]) -> str:
        nl = f"{g.lit(chr(10))} " if self.newlines else ""
        return f"{nl}{g.json(call_object(tools))} {nl}{g.lit(self.end)}"

    def render_calls(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        """An assistant turn's calls as this family writes them (for templates that cannot render calls)."""
        nl = "\n" if self.newlines else ""
        blocks = [
            f"{self.start}{nl}{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}{nl}{self.end}"
            for n, a in calls
        ]
        return self.separator.join(blocks)


@dataclass(frozen=True)
class Phi(Hermes):
    name: ClassVar[str] = "phi"
    start: ClassVar[str] = "<|tool_call|>"
    end: ClassVar[str] = "<|/tool_call|>"
    separator: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ("<|tool_call|>", "<|/tool_call|>")
    newlines: ClassVar[bool] = False
