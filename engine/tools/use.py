"""ToolUse: one request's tools, the model's call syntax and what follows from them, for whoever turns a chat into a
job (the OpenAI server and the app's local backend alike):

    use = ToolUse(tool_format_of(template, tokenizer), read_tools(raw), read_tool_choice(raw_choice, tools))
    messages = use.messages(chat_messages)          tool calls and results as the template takes them
    options = use.template_options()                the tool list as the template variable
    ... prompt ids from the chat template ...
    job = use.prepare(tokenizer, prompt_ids, reasoning)
        job.filters                                 hold the answer to the call syntax (auto/required/named)
        job.decode_special_tokens                   the job must keep special tokens in its text
        job.parser                                  reads content and calls from the job's results

With tool_choice `none` the tools still reach the template (the prompt stays the same across turns, and its cached
pages with it) but nothing is constrained or parsed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.generator.filters import Filter
from engine.reasoning import ReasoningFormat
from engine.tools.family import ToolFamily
from engine.tools.grammar import tool_filter
from engine.tools.messages import template_messages
from engine.tools.schema import Tool, ToolChoice
from engine.tools.stream import ToolCallParser

# The prompt tokens whose text says whether the prompt opened a reasoning block or a harmony message (as the
# generator's own reasoning split reads it).
PROMPT_TAIL_TOKENS = 16


@dataclass(frozen=True)
class ToolJob:
    """What a job that may call needs: its `filters`, whether it must `decode_special_tokens`, and the `parser`
    of its results (None, and no filters, when the answer may not call)."""

    filters: tuple[Filter, ...] = ()
    decode_special_tokens: bool = False
    parser: ToolCallParser | None = None


@dataclass(frozen=True)
class ToolUse:
    """The tools a request offers (`tools`), how it lets the answer use them (`choice`), whether several calls may
    come at once (`parallel`; a family that cannot write several writes one), and the model's syntax (`family`)."""

    family: ToolFamily
    tools: tuple[Tool, ...] = ()
    choice: ToolChoice = ToolChoice("none")
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Whether the answer may hold calls: there are tools and the choice allows them."""
        return bool(self.tools) and self.choice.calls

    def messages(self, messages: Sequence[Mapping[str, Any]], param: str = "messages") -> list[dict[str, Any]]:
        """The chat's messages as the template renders them (engine.tools.messages.template_messages)."""
        return template_messages(messages, self.family, self.tools, param)

    def template_options(self) -> dict[str, Any]:
        """Template variables: the tool definitions, under the name the template reads."""
        if not self.tools or not self.family.native:
            return {}
        return {self.family.variable: [t.definition() for t in self.tools]}

    def filters(
        self,
        tokenizer: Any,
        prompt_tail: str = "",
        reasoning: ReasoningFormat | None = None,
        content_schema: Mapping[str, Any] | None = None,
    ) -> tuple[Filter, ...]:
        """The job's filter holding the answer to the family's call syntax and each call to its tool's schema
        (none when the answer may not call). `content_schema` holds text answers of `auto` to a response_format.
        Raises ValueError when llguidance cannot compile the grammar."""
        if not self.active:
            return ()
        grammar = self.family.grammar(
            tokenizer, self.tools, self.choice, self.parallel, reasoning, prompt_tail, content_schema
        )
        return (tool_filter(grammar),)

    def decodes_special_tokens(self, tokenizer: Any) -> bool:
        return self.active and self.family.decodes_special_tokens(tokenizer)

    def parser(self, prompt_text: str = "") -> ToolCallParser | None:
        """A parser for the answer generated after `prompt_text` (None when the answer may not call)."""
        return self.family.parser(prompt_text) if self.active else None

    def prepare(
        self,
        tokenizer: Any,
        prompt_ids: torch.Tensor | Sequence[int],
        reasoning: ReasoningFormat | None = None,
        content_schema: Mapping[str, Any] | None = None,
    ) -> ToolJob:
        """The filters, decoding and parser of the job answering `prompt_ids` (a reasoning model's thinking comes
        first: `reasoning` is the chat front door's). Raises ValueError when llguidance cannot compile the grammar."""
        if not self.active:
            return ToolJob()
        ids = prompt_ids.flatten().tolist() if isinstance(prompt_ids, torch.Tensor) else list(prompt_ids)
        tail = tokenizer.decode(ids[-PROMPT_TAIL_TOKENS:], decode_special_tokens=True)
        return ToolJob(
            self.filters(tokenizer, tail, reasoning, content_schema),
            self.decodes_special_tokens(tokenizer),
            self.parser(tail),
        )
