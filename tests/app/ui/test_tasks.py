"""OnePerPass on the app's qasync loop: callers ready together go through in separate passes of the loop, in the
order they came; one cancelled while it waits, or holding its turn, does not stop the others."""

from __future__ import annotations

import asyncio

from app.ui.tasks import OnePerPass


async def _count_passes(passes: list[int], done: asyncio.Event) -> None:
    """Count the loop's passes: a callback that schedules itself runs once per pass."""
    loop = asyncio.get_running_loop()

    def tick() -> None:
        passes[0] += 1
        if not done.is_set():
            loop.call_soon(tick)

    loop.call_soon(tick)


def test_callers_ready_together_go_through_one_per_pass_in_order(run):
    turns = OnePerPass()
    passes = [0]
    through: list[tuple[int, int]] = []  # (caller, the pass it went through in)

    async def caller(i: int) -> None:
        await turns.take()
        through.append((i, passes[0]))

    async def go():
        done = asyncio.Event()
        await _count_passes(passes, done)
        await asyncio.gather(*(caller(i) for i in range(4)))  # all four ready in the same pass
        done.set()
        await turns.take()  # no one else waits: a later caller is not held up forever

    run(go())
    assert [i for i, _ in through] == [0, 1, 2, 3]
    seen = [p for _, p in through]
    assert all(a < b for a, b in zip(seen, seen[1:])), f"two callers went through in one pass: {through}"


def test_a_cancelled_caller_does_not_keep_the_others_waiting(run):
    turns = OnePerPass()
    through: list[int] = []
    tasks: dict[int, asyncio.Future] = {}

    async def caller(i: int) -> None:
        await turns.take()
        through.append(i)
        if i == 0:  # runs right after the turn is handed to 1, before 1 takes it: 1 is cancelled holding it
            asyncio.get_running_loop().call_soon(tasks[1].cancel)

    async def go():
        for i in range(5):
            tasks[i] = asyncio.ensure_future(caller(i))
        await asyncio.sleep(0)  # all five started: 0 went through, the others wait
        tasks[3].cancel()  # cancelled while it waits
        await asyncio.wait_for(asyncio.gather(tasks[0], tasks[2], tasks[4]), 5)

    run(go())
    assert through == [0, 2, 4]
    assert tasks[1].cancelled() and tasks[3].cancelled()
