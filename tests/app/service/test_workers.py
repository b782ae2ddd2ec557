"""app.service.workers: the one way off the GUI thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.service.workers import LOADER, PROMPT, VISION, in_worker, submit


def where() -> tuple[int, bool, str]:
    thread = threading.current_thread()
    return threading.get_ident(), thread.daemon, thread.name


def test_each_pool_runs_off_the_calling_thread_and_loads_on_daemons():
    async def main():
        return [await in_worker(where, pool=pool) for pool in (LOADER, PROMPT, VISION)]

    loader, prompt, vision = asyncio.run(main())
    assert threading.get_ident() not in {loader[0], prompt[0], vision[0]}
    assert loader[1] and loader[2] == "tandem-loader"  # quitting mid-load must not wait for it
    assert prompt[2].startswith("tandem-prompt") and vision[2].startswith("tandem-vision")


def test_errors_come_back_to_the_caller():
    def fail():
        raise ValueError("bad file")

    async def main(pool):
        return await in_worker(fail, pool=pool)

    for pool in (LOADER, PROMPT):
        with pytest.raises(ValueError, match="bad file"):
            asyncio.run(main(pool))
    with pytest.raises(ValueError, match="no worker pool 'gpu'"):
        submit(where, pool="gpu")
    assert submit(sum, [1, 2], pool=LOADER).result(timeout=10) == 3
