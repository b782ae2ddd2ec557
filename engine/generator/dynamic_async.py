"""asyncio wrappers: the generator runs on its own engine thread; the event loop only awaits results.

    event loop (GUI / server)              engine thread
    DynamicJobAsync(...)  -- enqueue -->   command queue -> generator.enqueue
    async for r in job    <-- results --   generator.iterate() -> loop.call_soon_threadsafe(queue.put_nowait)
    await job.cancel()    -- cancel  -->   generator.cancel -> end marker

iterate() never runs on the event loop, so a forward pass never stalls the GUI.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any

from engine.generator.dynamic import DynamicGenerator, JobFailure
from engine.generator.job import DynamicJob

log = logging.getLogger(__name__)

_END = object()  # delivered to a job's queue when it is cancelled or the generator closes


class DynamicGeneratorAsync:
    """A DynamicGenerator on a dedicated engine thread; arguments are passed to DynamicGenerator."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.generator = DynamicGenerator(*args, **kwargs)
        self.jobs: dict[int, DynamicJobAsync] = {}  # serial -> async job (touched by the engine thread only)
        self._commands: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tandem-engine", daemon=True)
        self._thread.start()

    # --- called from the event loop ------------------------------------------------------------------------

    def enqueue(self, job: DynamicJobAsync) -> None:
        if self._closed:
            raise RuntimeError("this generator is closed; create a new DynamicGeneratorAsync")
        self.generator.validate(job.job)  # can-never-fit errors surface here, in the caller
        self._commands.put(("enqueue", job, None))

    async def cancel(self, job: DynamicJobAsync) -> None:
        """Stop a job (queued, running or already finished) and wait until the engine thread has done it."""
        if self._closed or not self._thread.is_alive():
            job._deliver(_END)
            return
        done = asyncio.get_running_loop().create_future()
        self._commands.put(("cancel", job, done))
        await done

    async def close(self) -> None:
        """Cancel every job and stop the engine thread."""
        if self._closed:
            return
        self._closed = True
        self._commands.put(("close", None, None))
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    # --- engine thread -------------------------------------------------------------------------------------

    def _run(self) -> None:
        gen = self.generator
        while True:
            idle = gen.num_remaining_jobs() == 0
            try:
                commands = [self._commands.get(block=idle)]
            except queue.Empty:
                commands = []
            while True:
                try:
                    commands.append(self._commands.get_nowait())
                except queue.Empty:
                    break
            for kind, job, done in commands:
                if kind == "close":
                    gen.clear_queue()
                    for j in list(self.jobs.values()):
                        j._deliver(_END)
                    self.jobs.clear()
                    return
                if kind == "enqueue":
                    try:
                        gen.enqueue(job.job)
                        self.jobs[job.job.serial] = job
                    except Exception as e:
                        job._deliver(e)
                elif kind == "cancel":
                    gen.cancel(job.job)
                    self.jobs.pop(job.job.serial, None)
                    job.cancelled = True
                    job._deliver(_END)
                    done.get_loop().call_soon_threadsafe(lambda f=done: f.done() or f.set_result(None))
            if gen.num_remaining_jobs() == 0:
                continue
            try:
                results = gen.iterate()
            except JobFailure as failure:
                for job, error in failure.failures:
                    async_job = self.jobs.pop(job.serial, None)
                    if async_job is not None:
                        async_job._deliver(error)
                continue
            except Exception as e:  # not attributable to particular jobs: every running job gets it
                log.exception("generator iteration failed")
                gen.clear_queue()
                for j in list(self.jobs.values()):
                    j._deliver(e)
                self.jobs.clear()
                continue
            for r in results:
                async_job = self.jobs.get(r["serial"])
                if async_job is None:
                    continue
                async_job._deliver(r)
                if r["eos"]:
                    del self.jobs[r["serial"]]


class DynamicJobAsync:
    """A job whose results arrive with `async for result in job`; arguments are passed to DynamicJob."""

    def __init__(self, generator: DynamicGeneratorAsync, *args: Any, **kwargs: Any):
        self.job = DynamicJob(*args, **kwargs)
        self.generator = generator
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self._loop = asyncio.get_running_loop()
        generator.enqueue(self)

    def _deliver(self, item: Any) -> None:
        """Engine thread -> this job's event loop."""
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass  # the loop is closed: nobody is listening any more

    async def put_result(self, result: Any) -> None:
        await self.queue.put(result)

    async def __aiter__(self):
        while True:
            item = await self.queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
            if item["eos"]:
                return

    async def cancel(self) -> None:
        await self.generator.cancel(self)
