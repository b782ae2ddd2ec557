"""LoopThread: an asyncio event loop of its own in a daemon thread.

MCP sessions live here, not on the GUI's loop: a server that floods, stalls or takes seconds to start then
costs the window nothing, and the SDK's anyio task groups stay on one loop for their whole life. Callers on
another loop await `run(coro)`; plain threads (tests, shutdown) use `submit(coro).result(timeout)`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str = "tandem-tools") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on this thread's loop; its future may be waited on from any thread."""
        if self.loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise RuntimeError("The tools' thread has stopped; restart Tandem to use tools again.")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """`coro`'s result, awaited from another event loop without blocking it."""
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and wait up to `timeout` s for the thread (close sessions first: see McpClient.close)."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()
