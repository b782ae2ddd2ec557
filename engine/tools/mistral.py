"""Mistral's calls, after the special token [TOOL_CALLS], in one of two forms:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]      Mistral 7B v0.3, Nemo, Small 3
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]...                   the v11 tokenizers (Small 3.2,
                                                                                    Magistral, Devstral)

The parser reads both (the character after the marker tells which); the grammar writes the form the template
renders. Mistral's templates insist on call ids of 9 letters and digits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.harmony import held_suffix
from engine.tools.family import ToolFamily
from engine.tools.grammar import TEXT, WS, GrammarBuilder, call_object
from engine.tools.jsonscan import JsonCallBody, ValueScanner
from engine.tools.schema import Tool
from engine.tools.stream import ToolCallParser

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


class MistralParser(ToolCallParser):
    """Content until [TOOL_CALLS]; then a JSON array (or object) of calls, or name[CALL_ID]id[ARGS]arguments."""

    def __init__(self, id_style: str = "mistral"):
        super().__init__(id_style)
        self._mode = "text"  # text | after (the marker) | array | object | name | call_id | args
        self._body: JsonCallBody | None = None
        self._name = ""
        self._args: ValueScanner | None = None
        self._in_array = False  # the calls are items of a JSON array

    def _read(self, text: str) -> None:
        while text:
            text = getattr(self, f"_read_{self._mode}")(text)

    def _read_text(self, text: str) -> str:
        at = text.find(TOOL_CALLS)
        if at < 0:
            keep = held_suffix(text, (TOOL_CALLS,))
            self._text(text[: len(text) - keep])
            self._held = text[len(text) - keep :]
            return ""
        self._text(text[:at])
        self._mode = "after"
        return text[at + len(TOOL_CALLS) :]

    def _read_after(self, text: str) -> str:
        rest = text.lstrip()
        if not rest:
            return ""
        if rest[0] == "[":
            self._mode, self._in_array = "array", True
            return rest[1:]
        if rest[0] == "{":
            self._mode, self._body, self._in_array = "object", JsonCallBody(), False
            return rest
        self._mode, self._name = "name", ""
        return rest

    def _read_array(self, text: str) -> str:
        rest = text.lstrip(" \t\r\n,")
        if not rest:
            return ""
        if rest[0] == "]":
            self._mode, self._in_array = "text", False
            return rest[1:]
        self._mode, self._body = "object", JsonCallBody()
        return rest

    def _read_object(self, text: str) -> str:
        self._take(self._body.feed(text))
        if not self._body.done:
            return ""
        rest = self._body.rest
        self._end_body(self._body, self._body.text)
        self._body = None
        self._mode = "array" if self._in_array else "text"
        return rest

    def _read_name(self, text: str) -> str:
        text = self._name + text
        found = [(text.find(m), m) for m in (ARGS, CALL_ID) if m in text]
        if not found:
            keep = held_suffix(text, (ARGS, CALL_ID))
            self._name, self._held = text[: len(text) - keep], text[len(text) - keep :]
            return ""
        at, marker = min(found)
        self._open(text[:at].strip())
        self._name = ""
        self._mode = "call_id" if marker == CALL_ID else "args"
        self._args = ValueScanner()
        return text[at + len(marker) :]

    def _read_call_id(self, text: str) -> str:
        """The model's own call id, skipped: the parser's id stands in for it."""
        at = text.find(ARGS)
        if at < 0:
            keep = held_suffix(text, (ARGS,))
            self._held = text[len(text) - keep :]
            return ""
        self._mode = "args"
        return text[at + len(ARGS) :]

    def _read_args(self, text: str) -> str:
        end = self._args.feed(text)
        self._arguments(text if end is None else text[:end])
        if end is None:
            return ""
        self._mode = "text"
        return text[end:]

    def _end(self) -> None:
        held, self._held = self._held, ""
        if self._mode == "object":
            self._take(self._body.feed(held))
            self._end_body(self._body, self._body.text)
        elif self._mode == "name":
            self._text(TOOL_CALLS + self._name + held)  # a name never followed by arguments: no call
        elif self._mode == "text":
            self._text(held)
        self._mode = "text"


@dataclass(frozen=True)
class Mistral(ToolFamily):
    """The JSON-array form."""

    name: ClassVar[str] = "mistral"
    start: ClassVar[str] = TOOL_CALLS
    markers: ClassVar[tuple[str, ...]] = (TOOL_CALLS,)
    id_style: ClassVar[str] = "mistral"

    def parser(self, prompt_text: str = "") -> ToolCallParser:
        return MistralParser(self.id_style)

    def _array(self, g: GrammarBuilder, tools: Sequence[Tool], parallel: bool) -> str:
        array = {"type": "array", "items": call_object(tools), "minItems": 1}
        return g.json(array if parallel else {**array, "maxItems": 1})

    def required(self, g: GrammarBuilder, tools: Sequence[Tool], parallel: bool, prompt_tail: str) -> str:
        return f"{g.lit(self.start)} {WS}? {self._array(g, tools, parallel)}"

    def auto(
        self,
        g: GrammarBuilder,
        tools: Sequence[Tool],
        parallel: bool,
        content_schema: Mapping[str, Any] | None,
        prompt_tail: str,
    ) -> str:
        if content_schema is not None:
            return super().auto(g, tools, parallel, content_schema, prompt_tail)
        return f"{TEXT} | {g.until(self.start)} {WS}? {self._array(g, tools, parallel)}"

    def render_calls(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        items = [{"name": n, "arguments": a} for n, a in calls]
        return TOOL_CALLS + json.dumps(items, ensure_ascii=False)


@dataclass(frozen=True)
class MistralArgs(Mistral):
    """The name[ARGS]arguments form, one [TOOL_CALLS] per call."""

    name: ClassVar[str] = "mistral_args"
    markers: ClassVar[tuple[str, ...]] = (TOOL_CALLS, ARGS, CALL_ID)

    def call_body(self, g: GrammarBuilder, tools: Sequence[Tool]) -> str:
        return " | ".join(g.rule(f"{g.lit(t.name)} {g.lit(ARGS)} {g.json(t.parameters)}") for t in tools)

    def required(self, g: GrammarBuilder, tools: Sequence[Tool], parallel: bool, prompt_tail: str) -> str:
        return ToolFamily.required(self, g, tools, parallel, prompt_tail)

    def auto(
        self,
        g: GrammarBuilder,
        tools: Sequence[Tool],
        parallel: bool,
        content_schema: Mapping[str, Any] | None,
        prompt_tail: str,
    ) -> str:
        return ToolFamily.auto(self, g, tools, parallel, content_schema, prompt_tail)

    def render_calls(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        return "".join(f"{TOOL_CALLS}{n}{ARGS}{json.dumps(a, ensure_ascii=False)}" for n, a in calls)
