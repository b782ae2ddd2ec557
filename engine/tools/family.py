"""ToolFamily: what a model family's tool calls look like, as a parser (reading them) and a grammar (holding the
model to them). One subclass per syntax; engine.tools.formats picks one from the chat template.

Most families begin each call with a marker and write its body after it; the defaults here build their grammars
from `start` and `call_body`:

    required:  start body (separator start body)*      calls and nothing else
    auto:      TEXT | TEXT-up-to-start body (...)*     free text, or text and then calls

A family whose syntax differs (Llama's bare JSON, harmony's channels) overrides `required` / `auto`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.reasoning import ReasoningFormat
from engine.tools.grammar import TEXT, WS, GrammarBuilder, reasoning_prefix
from engine.tools.schema import Tool, ToolChoice
from engine.tools.stream import ToolCallParser


@dataclass(frozen=True)
class ToolFamily:
    """A tool-call syntax. `native`: the chat template renders tool definitions, calls and results itself (else
    engine.tools.messages writes them into the messages); `variable`: the template variable the tool list goes
    in. Class attributes: `name`, `start` (what begins a call), `separator` (between calls), `markers` (every
    marker of the syntax: those that are special tokens must be decoded for the parser to see them),
    `parallel` (the syntax can hold several calls in one answer) and `id_style` (engine.tools.calls.new_call_id).
    """

    native: bool = True
    variable: str = "tools"

    name: ClassVar[str] = ""
    start: ClassVar[str] = ""
    separator: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()
    parallel: ClassVar[bool] = True
    id_style: ClassVar[str] = "openai"

    def parser(self, prompt_text: str = "") -> ToolCallParser:
        """A parser for one answer generated after `prompt_text`."""
        raise NotImplementedError

    def render_calls(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        """An assistant turn's calls ((name, arguments) pairs) as text in this syntax, for a chat template that
        cannot render calls itself; a JSON list of them for a syntax with no text form (harmony's channels)."""
        return json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)

    def decodes_special_tokens(self, tokenizer: Any) -> bool:
        """Whether a job must keep special tokens in its text for this syntax's parser (some marker is one)."""
        special = tokenizer.special_token_ids
        return any(tokenizer.piece_to_id(m) in special for m in self.markers)

    # --- grammar -------------------------------------------------------------------------------------------

    def grammar(
        self,
        tokenizer: Any,
        tools: Sequence[Tool],
        choice: ToolChoice,
        parallel: bool,
        reasoning: ReasoningFormat | None = None,
        prompt_tail: str = "",
        content_schema: Mapping[str, Any] | None = None,
    ) -> str:
        """The lark grammar of an answer under `choice` (which must allow calls): calls only when it forces them
        (of the named tool for `function`), else text or calls, where the text is held to `content_schema` when
        one is given (a response_format). A reasoning model may think first; `prompt_tail` (the prompt's last
        tokens, special ones written out) says whether the prompt opened the block."""
        g = GrammarBuilder(tokenizer)
        chosen = [t for t in tools if choice.mode != "function" or t.name == choice.name]
        parallel = parallel and self.parallel
        if choice.forced:
            answer = self.required(g, chosen, parallel, prompt_tail)
        else:
            answer = self.auto(g, chosen, parallel, content_schema, prompt_tail)
        return g.source(f"{reasoning_prefix(g, reasoning, prompt_tail)} {answer}".strip())

    def call_body(self, g: GrammarBuilder, tools: Sequence[Tool]) -> str:
        """A call after its start marker."""
        raise NotImplementedError

    def required(self, g: GrammarBuilder, tools: Sequence[Tool], parallel: bool, prompt_tail: str) -> str:
        body = g.rule(self.call_body(g, tools))
        call = g.rule(f"{g.lit(self.start)} {body}")
        sep = f"{g.lit(self.separator)} " if self.separator else ""
        return g.repeat(call, f"{sep}{call}", parallel)

    def auto(
        self,
        g: GrammarBuilder,
        tools: Sequence[Tool],
        parallel: bool,
        content_schema: Mapping[str, Any] | None,
        prompt_tail: str,
    ) -> str:
        if content_schema is not None:
            return f"{g.json(content_schema)} | {WS}? {self.required(g, tools, parallel, prompt_tail)}"
        body = g.rule(self.call_body(g, tools))
        call = g.rule(f"{g.lit(self.start)} {body}")
        sep = f"{g.lit(self.separator)} " if self.separator else ""
        calls = g.repeat(f"{g.until(self.start)} {body}", f"{sep}{call}", parallel)
        return f"{TEXT} | {calls}"
