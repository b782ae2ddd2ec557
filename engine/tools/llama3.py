"""Llama 3.1 to 3.3's calls: the answer is one JSON object, {"name": ..., "parameters": {...}}, sometimes after
<|python_tag|>; an answer that does not begin with "{" (or the tag) is text. One call per answer: Meta's templates
refuse several.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.tools.family import ToolFamily
from engine.tools.grammar import WS, GrammarBuilder, call_object
from engine.tools.jsonscan import JsonCallBody
from engine.tools.schema import Tool
from engine.tools.stream import ToolCallParser

PYTHON_TAG = "<|python_tag|>"


class Llama3Parser(ToolCallParser):
    """A call object at the start (after whitespace or the tag), more after ";" or whitespace; else text."""

    def __init__(self, id_style: str = "openai"):
        super().__init__(id_style)
        self._mode = "start"  # start (nothing but whitespace yet) | text | call | between (after a call)
        self._body: JsonCallBody | None = None

    def _read(self, text: str) -> None:
        while text:
            if self._mode == "text":
                self._text(text)
                return
            if self._mode == "call":
                self._take(self._body.feed(text))
                if not self._body.done:
                    return
                text = self._body.rest
                self._end_body(self._body, self._body.text)
                self._body, self._mode = None, "between"
                continue
            rest = text.lstrip(" \t\r\n;" if self._mode == "between" else " \t\r\n")
            if not rest or (PYTHON_TAG.startswith(rest) and rest != PYTHON_TAG):
                self._held = text  # whitespace, or what may begin the tag: wait for more
                return
            if rest.startswith(PYTHON_TAG) or rest.startswith("{"):
                self._mode, self._body = "call", JsonCallBody()
                text = rest.removeprefix(PYTHON_TAG)
                continue
            self._mode = "text"
            self._text(text if not self.calls else rest)
            return

    def _end(self) -> None:
        held, self._held = self._held, ""
        if self._mode == "call":
            self._take(self._body.feed(held))
            self._end_body(self._body, self._body.text)
            self._body = None
        elif self._mode != "between":
            self._text(held)


@dataclass(frozen=True)
class Llama3(ToolFamily):
    name: ClassVar[str] = "llama3"
    start: ClassVar[str] = PYTHON_TAG
    markers: ClassVar[tuple[str, ...]] = (PYTHON_TAG,)
    parallel: ClassVar[bool] = False

    def parser(self, prompt_text: str = "") -> ToolCallParser:
        return Llama3Parser(self.id_style)

    def call_body(self, g: GrammarBuilder, tools: Sequence[Tool]) -> str:
        return g.json(call_object(tools, "parameters"))

    def required(self, g: GrammarBuilder, tools: Sequence[Tool], parallel: bool, prompt_tail: str) -> str:
        return f"{WS}? {g.lit(self.start)}? {self.call_body(g, tools)}"

    def auto(
        self,
        g: GrammarBuilder,
        tools: Sequence[Tool],
        parallel: bool,
        content_schema: Mapping[str, Any] | None,
        prompt_tail: str,
    ) -> str:
        # Text is what does not begin with "{": an answer that does is a call.
        text = g.json(content_schema) if content_schema is not None else g.rule(r"/[ \t\r\n]*([^{ \t\r\n](.|\n)*)?/")
        return f"{text} | {self.required(g, tools, parallel, prompt_tail)}"

    def render_calls(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)
