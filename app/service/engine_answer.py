"""The local engine's answer as the views read it: each streaming result of its job becomes an AnswerChunk.

The engine has split the text already (a job given the model's ReasoningFormat carries "reasoning" and
"answer" per result); the chunk passes that split on and counts the result's tokens instead of passing
its token ids. Results before the first token ("started", "prefill") are not chunks; a "prefill" result's
progress is kept on the answer (`prefill`), for a view that says how far the prompt has been read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from app.service.backend import EOS_KEYS, AnswerChunk
from engine import DynamicJobAsync
from engine.generator.results import Result
from engine.tools.stream import ToolCallParser


class EngineAnswer:
    """An AnswerJob over one engine job (`job`, a DynamicJobAsync). `first_seen` is the index of the message
    the model's view resumes at when the overflow policy dropped older turns (None: it sees them all);
    `context_capped`: the job may make fewer tokens than the settings ask, because the context ends first.
    `parser` reads an answer that may call tools: each chunk's answer is then its content, and the last chunk
    carries the calls under "tool_calls" (OpenAI's form)."""

    def __init__(
        self,
        job: DynamicJobAsync,
        first_seen: int | None = None,
        context_capped: bool = False,
        parser: ToolCallParser | None = None,
    ):
        self.job = job
        self.parser = parser
        self.first_seen = first_seen
        self.context_capped = context_capped
        self.prefill: tuple[int, int] | None = None  # (prompt tokens read, of how many) while the prompt is read

    def __aiter__(self) -> AsyncIterator[AnswerChunk]:
        return _Chunks(self, self.job.__aiter__())

    async def cancel(self) -> bool:
        return await self.job.cancel()


class _Chunks:
    # A plain iterator rather than an async generator: leaving `async for` early leaves the engine job's own
    # iterator to cancel the job, exactly as when it is read directly.
    def __init__(self, answer: EngineAnswer, results: AsyncIterator[Result]):
        self._answer = answer
        self._results = results

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> AnswerChunk:
        while True:
            result = await self._results.__anext__()
            if result["stage"] == "streaming":
                return answer_chunk(result, self._answer)
            if result["stage"] == "prefill":
                self._answer.prefill = (int(result["curr_progress"]), int(result["max_progress"]))

    async def aclose(self) -> None:
        await self._results.aclose()


def answer_chunk(result: Result, job: EngineAnswer) -> AnswerChunk:
    """The chunk of one streaming result; without a ReasoningFormat all of its text is answer."""
    text = result["text"]
    chunk: AnswerChunk = {
        "job": job,
        "stage": "streaming",
        "eos": bool(result["eos"]),
        "text": text,
        "thinking": result.get("reasoning", ""),
        "answer": result.get("answer", text),
        "num_tokens": int(result["token_ids"].shape[-1]),
    }
    if "identifier" in result:
        chunk["identifier"] = result["identifier"]
    for key in EOS_KEYS:
        if key in result:
            chunk[key] = result[key]
    if job.parser is not None:
        chunk["answer"] = job.parser.read_result(result).content
        if chunk["eos"] and job.parser.calls:
            chunk["tool_calls"] = [call.openai() for call in job.parser.calls]
    return chunk
