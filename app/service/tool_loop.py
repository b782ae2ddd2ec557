"""The tool loop: an answer that calls tools, the calls run (each once the user allows it), their results sent
back as tool messages, and the model answering again, until it answers without calls or the rounds run out.

    async for event in ToolLoop(backend, toolbox, approve).run(messages, system_prompt, images, settings):
        AnswerChunk   the model's answer as it streams, round after round (each round ends with an eos chunk;
                      one that calls has "tool_calls")
        ToolStep      a call: first as asked (`outcome` None, while it waits for approval and runs), then
                      with its outcome (`declined` when the user said no)

`approve(call)` is awaited for each call of a tool that asks first (app.tools.ToolBox.asks: all but those the
user always allows); the UI answers it, say with a dialog that resolves a Future, and the loop waits without
blocking anything. A refusal does not stop the loop: the model reads "the user declined" as the call's result
and answers with that. `messages` grows as the loop goes: after the loop it holds the whole exchange (the
assistant's calls and the tool results), for the chat to store.

The last round allowed (`max_rounds`) is asked with tool_choice "none", so the loop always ends with an answer.
A later round asks with `then_choice` (default "auto"): a first round forced to call ("required") does not
force the next ones. A call that the answer's length cap cut short (its arguments are not whole JSON) is left
out: it cannot run, and the loop ends when no whole call is left.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.service.backend import AnswerChunk, Backend, ImageSource
from app.service.generation import GenerationSettings
from app.service.tool_request import ToolRequest
from app.tools.spec import ToolOutcome
from app.tools.toolbox import ToolBox

MAX_ROUNDS = 8
DECLINED = "The user declined to run this tool call. Do not call it again; answer without it."


@dataclass(frozen=True)
class ToolStep:
    """One call: its id, the tool's `name`, the arguments' JSON text, and once run its `outcome`."""

    call_id: str
    name: str
    arguments: str
    outcome: ToolOutcome | None = None
    declined: bool = False
    round: int = 0


Approve = Callable[[ToolStep], Awaitable[bool]]


class ToolLoop:
    def __init__(
        self,
        backend: Backend,
        toolbox: ToolBox,
        approve: Approve,
        *,
        max_rounds: int = MAX_ROUNDS,
        choice: str | Mapping[str, Any] = "auto",
        then_choice: str | Mapping[str, Any] = "auto",
        parallel: bool = True,
    ) -> None:
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be at least 1, got {max_rounds}")
        self.backend = backend
        self.toolbox = toolbox
        self.approve = approve
        self.max_rounds = max_rounds
        self.choice = choice
        self.then_choice = then_choice
        self.parallel = parallel
        self.job: Any = None  # the round's answer job, for a cancel

    async def run(
        self,
        messages: list[dict[str, Any]],
        system_prompt: str,
        images: Sequence[ImageSource],
        settings: GenerationSettings,
        identifier: object = None,
    ) -> AsyncIterator[AnswerChunk | ToolStep]:
        definitions = self.toolbox.definitions()
        for round_ in range(self.max_rounds):
            last = round_ == self.max_rounds - 1
            choice = "none" if last else self.choice if round_ == 0 else self.then_choice
            request = ToolRequest(tuple(definitions), choice, self.parallel) if definitions else None
            self.job = await self.backend.start_answer(
                messages, system_prompt, images, settings, identifier, tools=request
            )
            calls: list[dict[str, Any]] = []
            content = ""
            async for chunk in self.job:
                content += chunk["answer"]
                calls = chunk.get("tool_calls") or calls
                yield chunk
            calls = [c for c in calls if _complete(c)]  # a call cut off by the length cap cannot run
            if not calls:
                return
            messages.append({"role": "assistant", "content": content or None, "tool_calls": calls})
            for call in calls:
                step = ToolStep(call["id"], call["function"]["name"], call["function"]["arguments"], round=round_)
                yield step
                done = await self._run(step)
                yield done
                messages.append({"role": "tool", "tool_call_id": step.call_id, "content": done.outcome.text})

    async def cancel(self) -> None:
        if self.job is not None:
            await self.job.cancel()

    async def _run(self, step: ToolStep) -> ToolStep:
        if self.toolbox.asks(step.name) and not await self.approve(step):
            return ToolStep(step.call_id, step.name, step.arguments, ToolOutcome(DECLINED), True, step.round)
        outcome = await self.toolbox.run(step.name, step.arguments)
        return ToolStep(step.call_id, step.name, step.arguments, outcome, False, step.round)


def _complete(call: Mapping[str, Any]) -> bool:
    """Whether a call's arguments are a whole JSON object (an answer cut at max_new_tokens may end inside one)."""
    try:
        return isinstance(json.loads(call["function"]["arguments"] or "{}"), dict)
    except (KeyError, TypeError, ValueError):
        return False
