"""The local engine's side of tool calling: a ToolRequest made into the model's call syntax (engine.tools).

    tools = LocalTools.of(loaded, request)            the model's format, the tools and the choice, checked
    messages = tools.messages(messages, system_prompt)  the system prompt first, calls and results as the template
                                                        takes them (with tools, the system prompt is messages[0])
    options = tools.template_options()                the tool list as the template's variable
    ... the prompt ...
    job = tools.prepare(prompt_ids)                   filters (the call grammar), decode_special_tokens, parser

EngineAnswer feeds each result to the parser; its last chunk carries the calls (app.service.engine_answer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from app.service.loaded import Loaded
from app.service.tool_request import ToolRequest
from engine.tools.formats import tool_format_of
from engine.tools.schema import read_tool_choice, read_tools
from engine.tools.use import ToolJob, ToolUse


@dataclass(frozen=True)
class LocalTools:
    loaded: Loaded
    use: ToolUse

    @classmethod
    def of(cls, loaded: Loaded, request: ToolRequest) -> LocalTools:
        """Raises ToolError (a ValueError naming the field) for a tool or choice the engine cannot use."""
        tools = read_tools([dict(t) for t in request.tools])
        choice = read_tool_choice(request.choice, tools)
        family = tool_format_of(loaded.template, loaded.tokenizer)
        return cls(loaded, ToolUse(family, tools, choice, request.parallel))

    def messages(self, messages: Sequence[Mapping[str, Any]], system_prompt: str) -> list[dict[str, Any]]:
        head = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return self.use.messages([*head, *messages])

    def template_options(self) -> dict[str, Any]:
        return self.use.template_options()

    def prepare(self, prompt_ids: torch.Tensor) -> ToolJob:
        """Blocking (llguidance compiles the grammar): run it off the GUI thread."""
        return self.use.prepare(self.loaded.tokenizer, prompt_ids, self.loaded.chat.reasoning)
