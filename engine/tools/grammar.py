"""Lark grammars (llguidance's dialect) that hold an answer to a family's call syntax and each call's arguments to
its tool's JSON schema, so a call always parses whatever the weights.

    %llguidance {}
    start: think answer                                  the reasoning block, when the model has one
    answer: TEXT | lead "\\n" %json {...} "\\n</tool_call>"  `auto`: free text, or text then well-formed calls
    lead[lazy]: TEXT "<tool_call>"                       lazy: the call begins at the marker's first occurrence
    TEXT: /(.|\\n)*/

A marker that is one special token of the vocabulary ([TOOL_CALLS], <|python_tag|>, harmony's <|channel|>) is
written as that token (`<[id]>`): TEXT cannot hold special tokens, so text simply stops where one begins. A marker
that is plain text (Qwen's <tool_call>) ends a lazy rule instead. Arguments are inline JSON schemas (`%json`),
spelled as templates' `tojson` spells them (engine.tools.schema.JSON_OPTIONS).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from engine.generator.filters import Filter
from engine.reasoning import HarmonyFormat, ReasoningFormat
from engine.tools.schema import Tool, with_options

TEXT = "TEXT"  # any text without special tokens
WS = "WS"  # whitespace


class GrammarBuilder:
    """Rules of one grammar for one tokenizer: `lit` spells a marker, `json` a schema, `rule` names a rule,
    `until` matches text up to a marker; `source(answer)` is the whole grammar with `start` leading to it."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.rules: list[str] = []
        self._count = 0

    def special_id(self, text: str) -> int | None:
        """The id of `text` when it is one special token of the vocabulary."""
        token_id = self.tokenizer.piece_to_id(text)
        return token_id if token_id is not None and token_id in self.tokenizer.special_token_ids else None

    def lit(self, text: str) -> str:
        """`text` in the grammar: a special token by id, else a string literal."""
        token_id = self.special_id(text)
        return f"<[{token_id}]>" if token_id is not None else json.dumps(text, ensure_ascii=False)

    def json(self, schema: Mapping[str, Any]) -> str:
        return "%json " + json.dumps(with_options(schema), ensure_ascii=False)

    def rule(self, body: str, lazy: bool = False) -> str:
        """A new rule named for `body`; lazy rules match as little text as they can (their body must end in a
        terminal: the marker they stop at)."""
        self._count += 1
        name = f"r{self._count}"
        self.rules.append(f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def until(self, marker: str) -> str:
        """Text up to the first `marker`, the marker included."""
        spelled = self.lit(marker)
        if spelled.startswith("<["):
            return f"{TEXT} {spelled}"
        return self.rule(f"{TEXT} {spelled}", lazy=True)

    def repeat(self, first: str, again: str, parallel: bool) -> str:
        """`first` once, then `again` any number of times when several calls are allowed."""
        return f"{first} ({again})*" if parallel else first

    def source(self, answer: str) -> str:
        return "\n".join(
            ["%llguidance {}", f"start: {answer}", *self.rules, rf"{TEXT}: /(.|\n)*/", rf"{WS}: /[ \t\r\n]+/", ""]
        )


def call_object(tools: Sequence[Tool], arguments_key: str = "arguments") -> dict[str, Any]:
    """The schema of one call written as {"name": ..., "<arguments_key>": {...}}: one of the tools, its
    arguments held to that tool's parameters; the name comes first."""
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, arguments_key: dict(t.parameters)},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def reasoning_prefix(g: GrammarBuilder, fmt: ReasoningFormat | None, prompt_tail: str) -> str:
    """What may come before the answer: a reasoning model's thinking block (free text), opened by the prompt or
    optionally by the model. Harmony's analysis channel is part of its own call syntax instead."""
    if fmt is None or isinstance(fmt, HarmonyFormat):
        return ""
    close = g.until(fmt.end)
    if fmt.starts_inside(prompt_tail):
        return f"{close} {WS}?"
    return f"({WS}? {g.lit(fmt.start)} {close} {WS}?)?"


def tool_filter(source: str) -> Filter:
    """A job filter holding the output to the grammar `source`; ValueError when llguidance refuses it."""
    import llguidance

    return Filter(llguidance.LLMatcher.grammar_from_lark(source), "tool-call grammar")
