"""Server-sent events, and noticing at once when a client goes away.

A job must end the moment its client disconnects, or a dropped stream keeps generating and holding cache
pages while it waits to be read (tabbyAPI #428's lockup). Starlette only notices a disconnect when a send
fails, which for a job still waiting in the queue may be never; so both the event stream and a plain
request race their work against the ASGI `http.disconnect` message and cancel the work when it comes.
Cancelling the task that iterates a job's results leaves its `async for`, which cancels the job.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


class ClientGone(Exception):
    """The client disconnected before its reply was ready."""


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def until_disconnected(receive: Receive) -> None:
    """Return when the client has gone (the request body must have been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """The result of `work`, or ClientGone (with `work` cancelled) if the client leaves first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(until_disconnected(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone()
    return task.result()


class EventStream(Response):
    """A `text/event-stream` reply of `events` (bytes each); `on_close` runs once it ends, however it ends."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]):
        self.events = events
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                    async for event in self.events:
                        await send({"type": "http.response.body", "body": event, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await until_disconnected(receive)
                group.cancel_scope.cancel()  # the client left: stop the stream (and with it the job) now
        except OSError:
            pass  # the connection broke while sending
        finally:
            await self.events.aclose()  # type: ignore[attr-defined]
            await self.on_close()
