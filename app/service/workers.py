"""The app's one way off the GUI thread: `await in_worker(fn, *args, pool=...)`.

Blocking work (a chat template, a vision tower, a model load, a download) runs on a worker thread; its
result or exception comes back on the calling asyncio loop (qasync's, the GUI thread), so no Qt receiver
ever runs on a worker and no forward pass runs on the GUI thread.

    pool=LOADER  a new daemon thread per call: quitting mid-load or mid-download must not wait for it
                 (executor threads are joined at interpreter exit; a daemon is not)
    pool=PROMPT  two threads: a chat template running to its time limit in one tab does not hold up the others
    pool=VISION  one thread: images are embedded one after another (the tower is not re-entrant)
    pool=FILES   two threads: checking an attached picture, warming the code highlighter; never waits
                 behind a chat template or a vision tower
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

LOADER = "loader"
PROMPT = "prompt"
VISION = "vision"
FILES = "files"
_POOL_SIZES = {PROMPT: 2, VISION: 1, FILES: 2}
_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


async def in_worker(fn: Callable[..., T], *args: Any, pool: str = PROMPT) -> T:
    """Run `fn(*args)` on a worker of `pool` (LOADER, PROMPT, VISION or FILES) and await its result on this loop."""
    return await asyncio.wrap_future(submit(fn, *args, pool=pool))


def submit(fn: Callable[..., T], *args: Any, pool: str = PROMPT) -> Future[T]:
    """Start `fn(*args)` on a worker of `pool`; for a Qt slot with no running asyncio loop (use in_worker
    where there is one). The future's callbacks run on the worker thread: hand news to the GUI by a signal."""
    if pool == LOADER:
        future: Future[T] = Future()
        threading.Thread(target=_settle, args=(future, fn, args), name="tandem-loader", daemon=True).start()
        return future
    if pool not in _POOL_SIZES:
        raise ValueError(f"no worker pool {pool!r}; use one of {LOADER!r}, {', '.join(map(repr, _POOL_SIZES))}")
    with _pools_lock:
        executor = _pools.get(pool)
        if executor is None:
            executor = _pools[pool] = ThreadPoolExecutor(_POOL_SIZES[pool], thread_name_prefix=f"tandem-{pool}")
    return executor.submit(fn, *args)


def _settle(future: Future, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*args))
    except Exception as e:
        future.set_exception(e)
    except BaseException as e:  # never leave the future pending
        future.set_exception(RuntimeError(f"the worker stopped: {e!r}"))
