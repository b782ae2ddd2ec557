"""Starting asyncio tasks from Qt slots: keep a reference (asyncio holds only weak ones) and log failures; and
OnePerPass, which spreads work that becomes ready all at once over several passes of the event loop."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)

_running: set[asyncio.Task] = set()


def spawn(coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task:
    """Run `coro` on the running (qasync) loop; an exception it raises is logged, never lost silently."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _running.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Task) -> None:
    _running.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s failed", task.get_name(), exc_info=task.exception())


class OnePerPass:
    """Lets one caller at a time through per pass of the event loop: `await turns.take()` returns at once when no
    one went through in this pass, else in a later pass, callers in the order they came.

    Tasks woken together run back to back: qasync runs every callback that is due in one pass, and Qt paints and
    handles input only between passes. Work that costs milliseconds each (an answer beginning: its message stored,
    its widget shown) would hold the window for the sum; taken in turns, for the largest one.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._held = False  # someone went through in this pass, or was woken to go through in the next one

    async def take(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (a test's): the old one's turns will never be handed on
            self._loop, self._waiting, self._held = loop, deque(), False
        if self._held:
            turn = loop.create_future()
            self._waiting.append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():  # cancelled with the turn in hand: hand it on
                    loop.call_soon(self._hand_on)
                raise
        self._held = True
        # call_soon runs in a later pass: qasync starts a zero timer, and Qt fires only the timers due when the pass
        # began; plain asyncio runs only the callbacks that were ready when its iteration began.
        loop.call_soon(self._hand_on)

    def _hand_on(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # (a caller cancelled while it waited left its turn behind)
                turn.set_result(None)  # still held: the woken caller goes through in the next pass
                return
        self._held = False
