"""gpt-oss's calls in harmony (engine.harmony): a commentary message addressed to a function, its arguments JSON,
ending the reply at <|call|>:

    <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

The parser reads the job's whole text (its channels are special tokens the job decodes) through a HarmonyParser,
which keeps calls apart from the answer; one call per reply, since <|call|> ends it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.harmony import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, START, HarmonyCall, HarmonyParser, opens_analysis
from engine.tools.family import ToolFamily
from engine.tools.grammar import TEXT, GrammarBuilder
from engine.tools.schema import Tool
from engine.tools.stream import ToolCallParser

FUNCTIONS = "functions."  # the namespace of the client's tools among a harmony model's recipients


class HarmonyCallParser(ToolCallParser):
    """The answer (final and preamble messages) as content, messages to `functions.*` as calls."""

    reads_raw_text: ClassVar[bool] = True

    def __init__(self, prompt_text: str = "", id_style: str = "openai"):
        super().__init__(id_style)
        self._harmony = HarmonyParser(prompt_text)
        self._seen = 0  # the harmony parser's calls looked at
        self._current: HarmonyCall | None = None  # the call whose arguments are still streaming
        self._sent = 0  # characters of its arguments given

    def _read(self, text: str) -> None:
        self._text(self._harmony.feed(text)[1])
        self._sync()

    def _end(self) -> None:
        self._text(self._harmony.finish()[1])
        self._sync()

    def _sync(self) -> None:
        calls = self._harmony.calls
        while True:
            if self._current is not None:
                fragment = self._current.arguments[self._sent :]
                self._arguments(fragment)
                self._sent += len(fragment)
            if self._seen == len(calls):
                return
            call = calls[self._seen]
            self._seen += 1
            self._current, self._sent = None, 0
            if call.recipient.startswith(FUNCTIONS):  # other recipients are the model's built-in tools
                self._current = call
                self._open(call.recipient[len(FUNCTIONS) :])


@dataclass(frozen=True)
class Harmony(ToolFamily):
    name: ClassVar[str] = "harmony"
    start: ClassVar[str] = CHANNEL
    markers: ClassVar[tuple[str, ...]] = (START, CHANNEL, MESSAGE, END, CALL, CONSTRAIN)
    parallel: ClassVar[bool] = False

    def parser(self, prompt_text: str = "") -> ToolCallParser:
        return HarmonyCallParser(prompt_text, self.id_style)

    def call_body(self, g: GrammarBuilder, tools: Sequence[Tool]) -> str:
        head = f'{g.lit(CHANNEL)} "commentary to={FUNCTIONS}"'
        alternatives = " | ".join(
            g.rule(f'"{t.name} " {g.lit(CONSTRAIN)} "json" {g.lit(MESSAGE)} {g.json(t.parameters)}') for t in tools
        )
        return f"{head} ({alternatives})"

    def _messages(self, g: GrammarBuilder, prompt_tail: str) -> str:
        """Whole messages before the last one: any channel, free text (and the one the prompt opened)."""
        opened = f'{g.until(END)} {g.lit(START)} "assistant" ' if opens_analysis(prompt_tail) else ""
        message = g.rule(f"{g.lit(CHANNEL)} /analysis|commentary|final/ {g.lit(MESSAGE)} {g.until(END)}")
        return f'{opened}({message} {g.lit(START)} "assistant")*'

    def required(self, g: GrammarBuilder, tools: Sequence[Tool], parallel: bool, prompt_tail: str) -> str:
        return f"{self._messages(g, prompt_tail)} {g.rule(self.call_body(g, tools))}"

    def auto(
        self,
        g: GrammarBuilder,
        tools: Sequence[Tool],
        parallel: bool,
        content_schema: Mapping[str, Any] | None,
        prompt_tail: str,
    ) -> str:
        text = g.json(content_schema) if content_schema is not None else TEXT
        last = g.rule(f"{g.lit(CHANNEL)} /analysis|commentary|final/ {g.lit(MESSAGE)} {text}")
        return f"{self._messages(g, prompt_tail)} ({last} | {g.rule(self.call_body(g, tools))})"
