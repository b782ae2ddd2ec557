"""Gemma 4's calls: not JSON but Gemma's own value syntax, keys bare and strings between <|"|> tokens:

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:[1,2]}<tool_call|>

The parser turns the arguments into JSON once a call closes (the call's name goes out as soon as its "{" does).
The grammar holds the call to a tool's name and its top-level argument names, and every value to the syntax, but
not to the schema's types: that would need each schema rewritten in Gemma's syntax.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.harmony import held_suffix
from engine.tools.family import ToolFamily
from engine.tools.grammar import GrammarBuilder
from engine.tools.schema import Tool
from engine.tools.stream import ToolCallParser

START, END, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_HEAD = re.compile(r"\s*call:\s*([A-Za-z0-9_.-]+)\s*\{")
_KEY = re.compile(r"\s*([^\s:{}\[\],]+)\s*:")
_SCALAR = re.compile(r"\s*([^\s,}\]]+)")


class GemmaParser(ToolCallParser):
    """Content until <|tool_call>; `call:NAME{...}` until <tool_call|>."""

    def __init__(self, id_style: str = "openai"):
        super().__init__(id_style)
        self._body: str | None = None  # the open call's text
        self._named = False

    def _read(self, text: str) -> None:
        while text:
            marker = START if self._body is None else END
            at = text.find(marker)
            upto = at if at >= 0 else len(text) - held_suffix(text, (marker,))
            if self._body is None:
                self._text(text[:upto])
            else:
                self._body += text[:upto]
                head = _HEAD.match(self._body)
                if head is not None and not self._named:
                    self._named = True
                    self._open(head.group(1))
            if at < 0:
                self._held = text[upto:]
                return
            if self._body is None:
                self._body, self._named = "", False
            else:
                self._close(END)
            text = text[at + len(marker) :]

    def _end(self) -> None:
        held, self._held = self._held, ""
        if self._body is None:
            self._text(held)
        else:
            self._body += held
            self._close("")

    def _close(self, end: str) -> None:
        """The call's text has ended (with `end`, the marker that ended it, or the answer)."""
        body, self._body = self._body or "", None
        head = _HEAD.match(body)
        try:
            arguments = read_value(body, head.end() - 1)[0] if head else None
        except ValueError:
            arguments = None
        if not self._named:
            if not isinstance(arguments, dict):
                self._text(START + body + end)  # no call after all
                return
            self._open(head.group(1))
        self._arguments(json.dumps(arguments if isinstance(arguments, dict) else {}, ensure_ascii=False))


def read_value(text: str, at: int) -> tuple[Any, int]:
    """The Gemma value at `text[at:]` as a JSON value, and where it ends; ValueError when it is not one."""
    while at < len(text) and text[at].isspace():
        at += 1
    if text.startswith(QUOTE, at):
        end = text.find(QUOTE, at + len(QUOTE))
        if end < 0:
            raise ValueError("an unclosed string")
        return text[at + len(QUOTE) : end], end + len(QUOTE)
    if text.startswith("{", at) or text.startswith("[", at):
        is_object, items, at = text[at] == "{", [], at + 1
        close = "}" if is_object else "]"
        while True:
            while at < len(text) and text[at] in " \t\r\n,":
                at += 1
            if text.startswith(close, at):
                return (dict(items) if is_object else items), at + 1
            if is_object:
                key = _KEY.match(text, at)
                if key is None:
                    raise ValueError(f"no key at {at}")
                value, at = read_value(text, key.end())
                items.append((key.group(1).replace(QUOTE, ""), value))
            else:
                value, at = read_value(text, at)
                items.append(value)
    scalar = _SCALAR.match(text, at)
    if scalar is None:
        raise ValueError(f"no value at {at}")
    word = scalar.group(1)
    literals = {"true": True, "false": False, "null": None, "None": None}
    if word in literals:
        return literals[word], scalar.end()
    try:
        return json.loads(word), scalar.end()
    except ValueError:
        return word, scalar.end()


def write_value(value: Any) -> str:
    """A JSON value in Gemma's syntax, keys sorted as its template writes them."""
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{write_value(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(write_value(v) for v in value) + "]"
    return "null" if value is None else json.dumps(value)


@dataclass(frozen=True)
class Gemma(ToolFamily):
    name: ClassVar[str] = "gemma"
    start: ClassVar[str] = START
    markers: ClassVar[tuple[str, ...]] = (START, END, QUOTE)

    def parser(self, prompt_text: str = "") -> ToolCallParser:
        return GemmaParser(self.id_style)

    def call_body(self, g: GrammarBuilder, tools: Sequence[Tool]) -> str:
        value = _value_rules(g)
        calls = []
        for t in tools:
            names = list(t.parameters.get("properties", {}))
            key = "/(" + "|".join(re.escape(n) for n in names) + ")/" if names else "GKEY"
            pair = g.rule(f'{key} ":" {value}')
            calls.append(g.rule(f'"call:{t.name}" "{{" ({pair} ("," {pair})*)? "}}"'))
        return f"({' | '.join(calls)}) {g.lit(END)}"

    def render_calls(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        return "".join(f"{START}call:{n}{write_value(dict(a))}{END}" for n, a in calls)


def _value_rules(g: GrammarBuilder) -> str:
    """Rules for any Gemma value (added once to the grammar); the value rule's name."""
    if not any(rule.startswith("gvalue:") for rule in g.rules):
        quote = g.lit(QUOTE)
        string = f"{quote} TEXT {quote}" if quote.startswith("<[") else f"{quote} {g.until(QUOTE)}"
        g.rules += [
            'gvalue: gstring | GNUM | "true" | "false" | "null" | gobject | garray',
            f"gstring: {string}",
            'gobject: "{" (gpair ("," gpair)*)? "}"',
            'gpair: GKEY ":" gvalue',
            'garray: "[" (gvalue ("," gvalue)*)? "]"',
            r"GNUM: /-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?/",
            "GKEY: /[A-Za-z_][A-Za-z0-9_]*/",
        ]
    return "gvalue"
