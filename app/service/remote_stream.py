"""One answer streamed from a remote OpenAI-compatible server, read as AnswerChunks (app.service.backend).

    start_answer ──> RemoteJob.start(): a reader task builds the request body (listing the models once,
                     fitting the chat to the context: app.service.remote_overflow), POSTs it and parses
                     the reply's server-sent events; a refusal for length before any text is asked again
                     with fewer old turns (the chat's policy) or without max_tokens
                        │   text deltas, finish_reason, usage ──> chunks ──> asyncio queue
    async for chunk in job  <───────────────────────────────────────────────────┘
    await job.cancel(): cancels the reader task, which closes the HTTP stream (the server cancels its job)

The reader runs in its own task so that Stop never has to wait for the next piece of the stream, and so a
caller that leaves `async for` early drops the connection at once, as leaving an engine job cancels it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpx2

from app.service.backend import AnswerChunk
from app.service.reasoning import THINK
from app.service.remote_errors import (
    RemoteBadReply,
    RemoteError,
    RemoteRefused,
    context_exceeded,
    not_openai,
    stated_context,
    status_error,
    stream_cut,
    transport_error,
)
from app.service.remote_overflow import RemoteFit

log = logging.getLogger(__name__)

# OpenAI finish_reason -> the engine's eos_reason.
EOS_REASONS = {"stop": "stop_token", "length": "max_new_tokens", "tool_calls": "stop_token"}

_END = object()  # queued after a cancel: iteration stops without an eos result, as an engine job's does


class RemoteJob:
    """A streamed chat completion; `async for chunk in job` yields its AnswerChunks.

    Each text delta is a chunk of one token, its thinking and answer split here (see _Split); the last chunk
    has "eos": True with "eos_reason", "full_completion", "new_tokens", "prompt_tokens", "cached_tokens" and
    the times "time_enqueued" (request sent -> reply headers), "time_prefill" (headers -> first text) and
    "time_generate" (first text -> last text). Failures are raised from the iteration as RemoteError, after
    every piece of text that did arrive.
    """

    def __init__(
        self,
        make_client: Callable[[], httpx2.AsyncClient],
        url: str,
        make_body: Callable[[], Awaitable[dict[str, Any]]],
        base_url: str,
        timeout: float,
        identifier: object = None,
        optional_fields: tuple[str, ...] = (),
        on_optional_refused: Callable[[], None] | None = None,
        fit: RemoteFit | None = None,
    ):
        self._make_client = make_client
        self._url = url
        self._make_body = make_body  # run in the reader task: what it raises (cannot list models) ends the job
        self._base_url = base_url
        self._timeout = timeout
        self.identifier = identifier
        # Sampler fields only some servers take (top_k, min_p, repetition_penalty): a server that refuses
        # them by name gets the request again without them, and `dropped_fields` tells the UI which.
        self._optional_fields = optional_fields
        self._on_optional_refused = on_optional_refused
        self.dropped_fields: tuple[str, ...] = ()
        # The chat's overflow policy: a refusal for length before any text drops more old turns (see refit).
        self._fit = fit
        self._built = asyncio.Event()  # the request body is made (its conversation fitted), or the job ended
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._finished = False  # the eos result, an error or the cancel marker has been handed out
        self.text = ""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._read(), name=f"remote-answer {self._url}")

    async def ready(self) -> None:
        """Return once the request is built, its conversation fitted to the context (so `first_seen` is known
        unless the server refuses it for length), or the job has ended (its error is raised by the iteration)."""
        if self._task is None:
            return
        built = asyncio.ensure_future(self._built.wait())
        try:
            await asyncio.wait({built, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            built.cancel()

    @property
    def first_seen(self) -> int | None:
        """Index of the first of the chat's messages the model sees, after the overflow policy dropped older
        ones (None: it sees them all); it moves on when a refusal for length makes more go."""
        return self._fit.first_seen if self._fit is not None else None

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def cancel(self) -> bool:
        """Close the stream now (the server sees the disconnect and stops); False when it had already ended."""
        if self._task is None or self._task.done():
            return False
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)  # the connection is closed when this returns
        self._queue.put_nowait(_END)
        return True

    async def __aiter__(self) -> AsyncIterator[AnswerChunk]:
        try:
            while not self._finished:
                item = await self._queue.get()
                if item is _END:
                    self._finished = True
                elif isinstance(item, BaseException):
                    self._finished = True
                    raise item
                else:
                    self._finished = item["eos"]
                    yield item
        finally:
            if not self._finished and self._task is not None:
                self._task.cancel()  # left early (break, a cancelled task): drop the connection

    # --- the reader task -----------------------------------------------------------------------------------

    async def _read(self) -> None:
        client = self._make_client()
        try:
            body = await self._make_body()
            self._built.set()
            while True:
                try:
                    await self._stream(client, body)
                    return
                except RemoteRefused as e:
                    if self.text:
                        raise
                    if context_exceeded(e):
                        body = await self._past_context(body, e)
                        continue
                    refused = [f for f in self._optional_fields if f in body and f in e.server_message]
                    if not refused:
                        raise
                    self.dropped_fields = tuple(f for f in self._optional_fields if f in body)
                    log.warning("%s refused %s; asking again without them", self._base_url, self.dropped_fields)
                    if self._on_optional_refused is not None:
                        self._on_optional_refused()
                    body = {k: v for k, v in body.items() if k not in self._optional_fields}
        except RemoteError as e:
            self._queue.put_nowait(e)
        except httpx2.TransportError as e:
            self._queue.put_nowait(transport_error(e, self._base_url, self._timeout, len(self.text)))
        except Exception as e:  # a bug here must still end the caller's async for
            log.exception("reading the remote answer failed")
            self._queue.put_nowait(RemoteError(f"Reading the answer from {self._base_url} failed: {e!r}"))
        finally:
            self._built.set()
            await client.aclose()

    async def _past_context(self, body: dict[str, Any], error: RemoteRefused) -> dict[str, Any]:
        """The request to send after a refusal for length: with more old turns left out where the chat's policy
        allows, else without max_tokens (the server then gives the answer the room the prompt leaves, which only
        it knows); `error` itself when neither is left."""
        patch = await self._fit.refit(stated_context(error)) if self._fit is not None else None
        if patch is not None:
            if "max_tokens" not in body:
                patch.pop("max_tokens", None)  # asked for once it was clear the context decides
            log.info("%s: past the context; asking again from message %s on", self._base_url, self.first_seen)
            return {**body, **patch}
        if "max_tokens" in body:
            log.info("%s: max_tokens past the context; asking for what the context leaves", self._base_url)
            return {k: v for k, v in body.items() if k != "max_tokens"}
        raise error

    async def _stream(self, client: httpx2.AsyncClient, body: dict[str, Any]) -> None:
        time_sent = time.perf_counter()
        async with client.stream("POST", self._url, json=body) as response:
            time_headers = time.perf_counter()
            if response.status_code >= 400:
                raise status_error(response.status_code, await response.aread(), self._url, body.get("model"))
            content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
            if content_type != "text/event-stream":
                raise not_openai(self._url, content_type, (await response.aread())[:2000])
            stats = _Stats(time_sent, time_headers)
            split = _Split()
            failure: RemoteError | None = None
            try:
                # Read to the end of the reply, past [DONE] and past a bad event, rather than leaving the loop:
                # httpx's reading generators left suspended are closed later by the garbage collector, outside
                # the event loop under qasync (which installs no async-generator hooks), and fail there.
                async for event in httpx2.EventSource(response):
                    if failure is not None or event.data.strip() == "[DONE]":
                        continue
                    try:
                        text, thinking, answer = split.feed(*stats.take(self._chunk(event.data)))
                    except RemoteError as e:
                        failure = e
                        continue
                    if text:
                        self.text += text
                        # servers send a token per delta; the eos chunk's new_tokens is the usage's count
                        self._put({"eos": False, "text": text, "thinking": thinking, "answer": answer, "num_tokens": 1})
            except httpx2.TransportError:
                if stats.finish_reason is None:
                    raise
                # The answer had ended (finish_reason came); only the usage chunk or [DONE] was lost.
            if failure is not None:
                raise failure
            if stats.finish_reason is None:
                raise stream_cut(self._base_url, len(self.text))
            thinking, answer = split.finish()  # a partial tag held back to the end
            self._put({**stats.eos_result(self.text), "thinking": thinking, "answer": answer, "num_tokens": 0})

    def _chunk(self, data: str) -> Mapping[str, Any]:
        try:
            chunk = json.loads(data)
        except ValueError:
            raise not_openai(self._url, "an event that is not JSON", data.encode()) from None
        if not isinstance(chunk, dict):
            raise not_openai(self._url, "an event that is not a JSON object", data.encode())
        if "error" in chunk:  # vLLM and llama-server report failures mid-stream as an event
            error = chunk["error"]
            said = error.get("message", "") if isinstance(error, dict) else str(error)
            raise RemoteRefused(f'The server at {self._base_url} stopped the answer with an error: "{said}"', 500, said)
        if not isinstance(chunk.get("choices"), list) and "usage" not in chunk:
            raise RemoteBadReply(
                f"The server at {self._base_url} streamed events that are not chat completion chunks "
                f"(no 'choices'): {data[:160]!r}. Check that the URL is an OpenAI-compatible API."
            )
        return chunk

    def _put(self, fields: dict[str, Any]) -> None:
        chunk: AnswerChunk = {"job": self, "stage": "streaming", **fields}
        if self.identifier is not None:
            chunk["identifier"] = self.identifier
        self._queue.put_nowait(chunk)


class _Stats:
    """What the chunks of one stream say about its end: finish reason, usage and the times of its text."""

    def __init__(self, time_sent: float, time_headers: float):
        self.time_sent = time_sent
        self.time_headers = time_headers
        self.time_first: float | None = None
        self.time_last: float | None = None
        self.num_text_chunks = 0
        self.finish_reason: str | None = None
        self.stop_reason: object = None
        self.usage: Mapping[str, Any] = {}
        self.calls: dict[int, dict[str, Any]] = {}  # tool calls by index, their arguments joined as they stream

    def take(self, chunk: Mapping[str, Any]) -> tuple[str, str]:
        """The chunk's (thinking sent apart, content) deltas of its first choice, noting its finish reason and
        usage. Thinking comes as `reasoning_content` (vLLM, llama-server, Tandem's server) or `reasoning`
        (newer vLLM)."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]  # transformers serve puts it on the last choice chunk, others apart
        choices = chunk.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return "", ""
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
            self.stop_reason = choice.get("stop_reason")  # vLLM: the stop string that ended the answer
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        reasoning = _text(delta, "reasoning_content") or _text(delta, "reasoning")
        content = _text(delta, "content")
        self._take_calls(delta.get("tool_calls"))
        if not reasoning and not content:
            return "", ""
        now = time.perf_counter()
        self.time_first = self.time_first if self.time_first is not None else now
        self.time_last = now
        self.num_text_chunks += 1
        return reasoning, content

    def _take_calls(self, deltas: Any) -> None:
        """OpenAI's delta.tool_calls: a call's first delta has its index, id and name, later ones add arguments."""
        for d in deltas if isinstance(deltas, list) else []:
            if not isinstance(d, dict):
                continue
            index = d.get("index") if isinstance(d.get("index"), int) else len(self.calls)
            call = self.calls.setdefault(
                index, {"id": f"call_{index}", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            function = d.get("function") if isinstance(d.get("function"), dict) else {}
            if isinstance(d.get("id"), str) and d["id"]:
                call["id"] = d["id"]
            if isinstance(function.get("name"), str) and not call["function"]["name"]:
                call["function"]["name"] = function["name"]
            if isinstance(function.get("arguments"), str):
                call["function"]["arguments"] += function["arguments"]

    def eos_result(self, full_completion: str) -> dict[str, Any]:
        now = time.perf_counter()
        first = self.time_first if self.time_first is not None else now
        last = self.time_last if self.time_last is not None else first
        details = self.usage.get("prompt_tokens_details") or {}
        reason = EOS_REASONS.get(self.finish_reason, "stop_token")
        if reason == "stop_token" and isinstance(self.stop_reason, str):
            reason = "stop_string"
        return {
            "stage": "streaming",
            "eos": True,
            "text": "",
            "eos_reason": reason,
            "full_completion": full_completion,
            # Without usage, each text chunk is counted as one token (servers send one chunk per token).
            "new_tokens": int(self.usage.get("completion_tokens") or self.num_text_chunks),
            "prompt_tokens": int(self.usage.get("prompt_tokens") or 0),
            "cached_tokens": int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
            "time_enqueued": self.time_headers - self.time_sent,
            "time_prefill": first - self.time_headers,
            "time_generate": last - first,
        } | ({"tool_calls": [self.calls[i] for i in sorted(self.calls)]} if self.calls else {})


class _Split:
    """One remote answer split into thinking and answer once, delta by delta.

    Thinking the server sends apart goes back between <think> tags, the form the app stores (so a remote
    thinking model's thinking stays out of the next prompt, as a local one's does); that text then goes
    through the engine's ReasoningParser, which also finds tags a server left inline in the content. What
    it shows is what a stored answer's split gives when the chat is opened again.
    """

    def __init__(self) -> None:
        self._thinking = False  # inside thinking sent apart, whose <think> block is not closed yet
        self._parser = THINK.parser()

    def feed(self, reasoning: str, content: str) -> tuple[str, str, str]:
        """(text as the model wrote it, its thinking, its answer) of one delta."""
        text = ""
        if reasoning:
            text += reasoning if self._thinking else THINK.start + reasoning
            self._thinking = True
        if content:
            text += THINK.end + content if self._thinking else content
            self._thinking = False
        return (text, *self._parser.feed(text)) if text else ("", "", "")

    def finish(self) -> tuple[str, str]:
        """(thinking, answer) held back at the end of the stream (text that might have begun a tag)."""
        return self._parser.finish()


def _text(delta: Mapping[str, Any], key: str) -> str:
    value = delta.get(key)
    return value if isinstance(value, str) else ""
