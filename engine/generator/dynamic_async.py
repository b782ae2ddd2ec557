"""asyncio wrappers: the generator runs on its own engine thread; the event loop only awaits results.

    event loop (GUI / server)              engine thread
    DynamicJobAsync(...)  -- enqueue -->   command queue -> generator.enqueue
    async for r in job    <-- results --   generator.iterate() -> loop.call_soon_threadsafe(job._receive)
    await job.cancel()    -- cancel  -->   generator.cancel -> end marker
    break / aclose()      -- cancel  -->   (same, without waiting)

iterate() never runs on the event loop, so a forward pass never stalls the GUI.

Every job's iteration ends exactly once: with its eos result, with an exception (its own failure, or
GeneratorClosedError when the generator is closed or its engine thread stops before the job is done), or
quietly after `cancel()`. A consumer that leaves `async for` early cancels the job and its queue is emptied.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Sequence
from typing import Any

import torch

from engine.cache.cache import Cache
from engine.generator.dynamic import DynamicGenerator, JobFailure
from engine.generator.filters import Filter
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.reasoning import ReasoningFormat

log = logging.getLogger(__name__)

_END = object()  # delivered to a job's queue when it is cancelled


class GeneratorClosedError(RuntimeError):
    """The generator was closed, or its engine thread stopped, before this job finished; no new jobs are taken."""


def _is_last(item: Any) -> bool:
    """An item after which a job's queue receives nothing more."""
    return item is _END or isinstance(item, BaseException) or bool(item["eos"])


def _resolve(done: asyncio.Future | None, value: bool) -> None:
    if done is None:
        return
    try:
        done.get_loop().call_soon_threadsafe(lambda: done.done() or done.set_result(value))
    except RuntimeError:
        pass  # the waiting loop is closed


class DynamicGeneratorAsync:
    """A DynamicGenerator on a dedicated engine thread; its parameters are DynamicGenerator's, with its defaults."""

    def __init__(
        self,
        model,
        cache: Cache,
        tokenizer,
        max_batch_size: int | None = None,
        max_seq_len: int | None = None,
        max_chunk_size: int | None = None,
        max_q_size: int = 8,
        draft_model=None,
        draft_cache=None,
        num_draft_tokens: int = 4,
        use_ngram_draft: bool = False,
        max_ngram: int = 4,
        max_sampling_threads: int = 16,
        min_sampling_threads: int = 3,
        paged: bool = True,
        filter_background_eval: bool = True,
        adapt_threads: bool = True,
    ):
        self.generator = DynamicGenerator(
            model,
            cache,
            tokenizer,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            max_chunk_size=max_chunk_size,
            max_q_size=max_q_size,
            draft_model=draft_model,
            draft_cache=draft_cache,
            num_draft_tokens=num_draft_tokens,
            use_ngram_draft=use_ngram_draft,
            max_ngram=max_ngram,
            max_sampling_threads=max_sampling_threads,
            min_sampling_threads=min_sampling_threads,
            paged=paged,
            filter_background_eval=filter_background_eval,
            adapt_threads=adapt_threads,
        )
        self.jobs: dict[int, DynamicJobAsync] = {}  # serial -> async job (touched by the engine thread only)
        self._commands: queue.Queue = queue.Queue()
        # Orders enqueue/cancel/close against the engine thread stopping, so no command is left unread.
        self._lock = threading.Lock()
        self._live: set[DynamicJobAsync] = set()  # accepted by enqueue, not yet given their last item
        self._closed = False
        self._stopped: BaseException | None = None  # what ended the engine thread on its own
        self._thread = threading.Thread(target=self._run, name="tandem-engine", daemon=True)
        self._thread.start()

    # --- called from the event loop ------------------------------------------------------------------------

    def enqueue(self, job: DynamicJobAsync) -> None:
        self._check_open()
        self.generator.validate(job.job)  # can-never-fit errors surface here, in the caller
        with self._lock:
            self._check_open()
            self._live.add(job)
            self._commands.put(("enqueue", job, None))

    async def cancel(self, job: DynamicJobAsync) -> bool:
        """Stop a job (queued, running or already finished) and wait until the engine thread has done it.

        Returns True if the job was still queued or running. A job of another generator is left alone (False).
        """
        if job.generator is not self:
            return False
        with self._lock:
            if self._closed or self._stopped is not None:
                return False  # every job it held has had (or is being sent) its last item
            done = asyncio.get_running_loop().create_future()
            self._commands.put(("cancel", job, done))
        return await done

    async def close(self) -> None:
        """Stop the engine thread; jobs still queued or running end with GeneratorClosedError."""
        with self._lock:
            if not self._closed and self._stopped is None:
                self._commands.put(("close", None, None))
            self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def _check_open(self) -> None:
        if self._stopped is not None:
            e = self._stopped
            raise GeneratorClosedError(
                f"the engine thread stopped ({type(e).__name__}: {e}); this generator takes no new jobs. "
                "Close it and create a new DynamicGeneratorAsync"
            ) from e
        if self._closed:
            raise GeneratorClosedError("this generator is closed; create a new DynamicGeneratorAsync")

    def _cancel_later(self, job: DynamicJobAsync) -> None:
        """The job's consumer left: cancel it without waiting (callable where nothing can be awaited)."""
        with self._lock:
            if not self._closed and self._stopped is None:
                self._commands.put(("cancel", job, None))

    # --- engine thread -------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # KeyboardInterrupt, SystemExit, ...: this thread must not die silently
            log.critical("the engine thread stopped: %s: %s", type(e).__name__, e, exc_info=True)
            self._stop(e)

    def _serve(self) -> None:
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
                    # Every enqueue put before the close has been read by now, so every live job is in `jobs`.
                    with self._lock:
                        live, self._live = list(self._live), set()
                    self._end_all(
                        live, lambda: GeneratorClosedError("the generator was closed before this job finished")
                    )
                    return
                if kind == "enqueue":
                    try:
                        gen.enqueue(job.job)
                        self.jobs[job.job.serial] = job
                    except Exception as e:
                        self._send(job, e)
                elif kind == "cancel":
                    stopped = gen.cancel(job.job)
                    if self.jobs.get(job.job.serial) is job:
                        del self.jobs[job.job.serial]
                    job.cancelled = True
                    self._send(job, _END)
                    _resolve(done, stopped)
            if gen.num_remaining_jobs() == 0:
                continue
            try:
                results = gen.iterate()
            except JobFailure as failure:
                for job, error in failure.failures:
                    async_job = self.jobs.pop(job.serial, None)
                    if async_job is not None:
                        self._send(async_job, error)
                continue
            except Exception as e:  # not attributable to particular jobs: every job in the generator gets it
                log.exception("generator iteration failed")
                running = list(self.jobs.values())
                with self._lock:
                    self._live.difference_update(running)
                self._end_all(running, lambda e=e: e)
                continue
            for r in results:
                async_job = self.jobs.get(r["serial"])
                if async_job is None:
                    continue
                if r["eos"]:
                    del self.jobs[r["serial"]]
                self._send(async_job, r)

    def _send(self, job: DynamicJobAsync, item: Any) -> None:
        if _is_last(item):
            with self._lock:
                self._live.discard(job)
        job._deliver(item)

    def _end_all(self, jobs: list[DynamicJobAsync], error) -> None:
        """Cancel every job in the generator (freeing every page) and hand each of `jobs` `error()`."""
        try:
            self.generator.clear_queue()
        except Exception:
            log.exception("could not cancel the generator's jobs")
        self.jobs.clear()
        for job in jobs:
            job._deliver(error())

    def _stop(self, cause: BaseException) -> None:
        with self._lock:
            self._stopped = cause
            live, self._live = list(self._live), set()  # queued or running, or still waiting in `pending`
            pending = []  # commands put before _stopped was set; none can follow it
            while True:
                try:
                    pending.append(self._commands.get_nowait())
                except queue.Empty:
                    break
        for kind, job, done in pending:
            if kind == "cancel":
                job.cancelled = True
                _resolve(done, False)

        def error() -> GeneratorClosedError:
            e = GeneratorClosedError(
                f"the engine thread stopped ({type(cause).__name__}: {cause}) before this job finished; close "
                "this generator and create a new DynamicGeneratorAsync"
            )
            e.__cause__ = cause
            return e

        self._end_all(live, error)


class DynamicJobAsync:
    """A job whose results arrive with `async for result in job`, enqueued on `generator` at once; the other
    parameters are DynamicJob's, with its defaults.

    Leaving the loop early (break, an exception, or closing the iterator) cancels the job.
    """

    def __init__(
        self,
        generator: DynamicGeneratorAsync,
        input_ids: torch.Tensor | Sequence[int],
        max_new_tokens: int,
        min_new_tokens: int = 0,
        max_skips: int = 4,
        gen_settings: SamplerSettings | None = None,
        seed: int | None = None,
        stop_conditions: Sequence[int | str] | None = None,
        decode_special_tokens: bool = False,
        return_top_tokens: int = 0,
        return_logits: bool = False,
        return_probs: bool = False,
        filters: Sequence[Filter] | Filter | None = None,
        filter_prefer_eos: bool = False,
        token_healing: bool = False,
        identifier: object = None,
        banned_strings: Sequence[str] | None = None,
        embeddings: Sequence[Any] | None = None,
        reasoning: ReasoningFormat | None = None,
        prompt_penalties: bool = True,
        priority: int = 0,
    ):
        self.job = DynamicJob(
            input_ids,
            max_new_tokens,
            min_new_tokens=min_new_tokens,
            max_skips=max_skips,
            gen_settings=gen_settings,
            seed=seed,
            stop_conditions=stop_conditions,
            decode_special_tokens=decode_special_tokens,
            return_top_tokens=return_top_tokens,
            return_logits=return_logits,
            return_probs=return_probs,
            filters=filters,
            filter_prefer_eos=filter_prefer_eos,
            token_healing=token_healing,
            identifier=identifier,
            banned_strings=banned_strings,
            embeddings=embeddings,
            reasoning=reasoning,
            prompt_penalties=prompt_penalties,
            priority=priority,
        )
        self.generator = generator
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self._loop = asyncio.get_running_loop()
        self._ended = False  # the last item (eos result, error or end marker) has been received
        self._abandoned = False  # the consumer left early: later items are dropped
        generator.enqueue(self)

    def _deliver(self, item: Any) -> None:
        """Engine thread (or any thread) -> this job's event loop."""
        try:
            self._loop.call_soon_threadsafe(self._receive, item)
        except RuntimeError:
            pass  # the loop is closed: nobody is listening any more

    def _receive(self, item: Any) -> None:
        if self._ended:
            return  # e.g. a cancel's end marker after the eos result
        self._ended = _is_last(item)
        if not self._abandoned:
            self.queue.put_nowait(item)

    async def put_result(self, result: Any) -> None:
        """Hand this job's consumer a result as if the engine had produced it (the seed documents' method;
        results from the engine thread arrive the same way). An eos result is the job's last item."""
        self._receive(result)

    async def __aiter__(self):
        finished = False
        try:
            while not finished:
                if self._abandoned or (self._ended and self.queue.empty()):
                    return  # an earlier loop took the last item, or left early and cancelled the job
                item = await self.queue.get()
                finished = _is_last(item)
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not finished:
                self._abandon()

    def _abandon(self) -> None:
        # The iterator was closed before the job's last item (break, aclose, garbage, a cancelled task).
        if self._abandoned:
            return
        self._abandoned = True
        while not self.queue.empty():
            self.queue.get_nowait()
        if not self._ended:
            self.generator._cancel_later(self)

    async def cancel(self) -> bool:
        return await self.generator.cancel(self)
