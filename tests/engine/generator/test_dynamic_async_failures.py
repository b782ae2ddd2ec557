"""The engine thread cannot die or leak silently: BaseExceptions, admission failures, abandoned
consumers, close() mid-stream, and a property test mixing them all."""

from __future__ import annotations

import asyncio

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cache import Cache
from engine.generator.dynamic_async import DynamicGeneratorAsync, DynamicJobAsync, GeneratorClosedError
from engine.generator.sampler import SamplerSettings

GREEDY = SamplerSettings.greedy()
FAIL, DIE = "\x07", "\x08"  # DRY breakers the test tokenizer refuses to encode: RuntimeError / KeyboardInterrupt


class FailingTokenizer:
    """The model's tokenizer, failing when asked to encode a marker: a real seam, since DRY breakers are
    tokenised on the engine thread when a job is admitted."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def encode(self, text, *args, **kwargs):
        if isinstance(text, str) and FAIL in text:
            raise RuntimeError("injected tokenizer failure")
        if isinstance(text, str) and DIE in text:
            raise KeyboardInterrupt("injected on the engine thread")
        return self._tokenizer.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def make(model, pages=64, **kw):
    cache = Cache(model, max_seq_len=pages * 16, page_size=16)
    return DynamicGeneratorAsync(model, cache, FailingTokenizer(model.tokenizer), **kw)


def marked(marker: str) -> SamplerSettings:
    return SamplerSettings.greedy(dry_multiplier=0.5, dry_sequence_breakers=(marker,))


async def outcome(job, results: list[dict] | None = None) -> tuple[list[dict], BaseException | None]:
    results = [] if results is None else results
    try:
        async for r in job:
            results.append(r)
    except Exception as e:
        return results, e
    return results, None


def pages_in_use(gen) -> int:
    return len(gen.generator.page_table.referenced_pages())


async def until(predicate, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_base_exception_on_the_engine_thread_ends_every_job_and_refuses_new_work(tiny_model):
    async def main():
        gen = make(tiny_model)
        running = DynamicJobAsync(gen, torch.tensor([[5] * 8]), 800, gen_settings=GREEDY)
        await until(lambda: running.queue.qsize() > 0)  # streaming has begun
        waiting = DynamicJobAsync(gen, torch.tensor([[9] * 8]), 800, gen_settings=GREEDY)
        killer = DynamicJobAsync(gen, torch.tensor([[6] * 8]), 10, gen_settings=marked(DIE))
        outs = await asyncio.wait_for(asyncio.gather(*(outcome(j) for j in (running, waiting, killer))), 60)
        for results, error in outs:
            assert isinstance(error, GeneratorClosedError) and "engine thread stopped" in str(error)
            assert isinstance(error.__cause__, KeyboardInterrupt)
            assert not any(r["eos"] for r in results)
        with pytest.raises(GeneratorClosedError, match="engine thread stopped.*KeyboardInterrupt"):
            DynamicJobAsync(gen, torch.tensor([[5, 6]]), 4)
        assert await running.cancel() is False
        await asyncio.wait_for(gen.close(), 10)
        assert not gen._thread.is_alive() and pages_in_use(gen) == 0

    asyncio.run(main())


def test_failure_at_admission_fails_only_that_job(tiny_model):
    async def main():
        gen = make(tiny_model)
        # Enqueued together, so the engine thread admits all of them in one iterate().
        jobs = [DynamicJobAsync(gen, torch.tensor([[5 + i] * 8]), 6, gen_settings=GREEDY) for i in range(3)]
        jobs.insert(1, DynamicJobAsync(gen, torch.tensor([[9] * 8]), 6, gen_settings=marked(FAIL)))
        outs = await asyncio.wait_for(asyncio.gather(*(outcome(j) for j in jobs)), 60)
        bad_results, bad_error = outs.pop(1)
        assert isinstance(bad_error, ValueError) and "dry_sequence_breakers" in str(bad_error) and not bad_results
        for results, error in outs:
            assert error is None and results[-1]["eos"] and results[-1]["new_tokens"] == 6
        await gen.close()
        assert pages_in_use(gen) == 0

    asyncio.run(main())


def test_leaving_async_for_early_cancels_the_job_and_drops_its_results(tiny_model):
    async def main():
        gen = make(tiny_model)
        broken = DynamicJobAsync(gen, torch.tensor([[5] * 8]), 900, gen_settings=GREEDY)
        async for r in broken:
            if r.get("text") or len(r.get("token_ids", [[]])[0]) > 0:
                break  # no cancel(): the iterator is dropped here
        await until(lambda: broken.cancelled)
        closed = DynamicJobAsync(gen, torch.tensor([[6] * 8]), 900, gen_settings=GREEDY)
        it = closed.__aiter__()
        await it.__anext__()
        await it.aclose()
        await until(lambda: closed.cancelled)
        await until(lambda: gen.generator.num_remaining_jobs() == 0)
        assert pages_in_use(gen) == 0
        await asyncio.sleep(0.1)  # anything still on its way is dropped, not queued
        assert broken.queue.qsize() == 0 and closed.queue.qsize() == 0
        assert [r async for r in broken] == []  # a second loop ends at once instead of waiting forever
        later = DynamicJobAsync(gen, torch.tensor([[7] * 8]), 4, gen_settings=GREEDY)
        assert (await outcome(later))[0][-1]["eos"]
        await gen.close()

    asyncio.run(main())


def test_close_while_jobs_stream_ends_each_with_generator_closed_error(tiny_model):
    async def main():
        gen = make(tiny_model)
        jobs = [DynamicJobAsync(gen, torch.tensor([[5 + i] * 8]), 300, gen_settings=GREEDY) for i in range(3)]
        seen: list[list[dict]] = [[] for _ in jobs]
        tasks = [asyncio.create_task(outcome(j, r)) for j, r in zip(jobs, seen)]
        await until(lambda: all(any(x["stage"] == "streaming" for x in r) for r in seen))
        await asyncio.wait_for(gen.close(), 30)
        for results, error in await asyncio.wait_for(asyncio.gather(*tasks), 30):
            assert isinstance(error, GeneratorClosedError) and "closed before this job finished" in str(error)
            assert not any(r["eos"] for r in results)
        assert pages_in_use(gen) == 0

    asyncio.run(main())


# --- everything at once ----------------------------------------------------------------------------------

KINDS = ("ok", "ok", "ok", "fail", "no_logit", "die")
ops = st.lists(
    st.one_of(
        # enqueue: prompt token, max_new_tokens, what the job does, results read before the consumer breaks
        st.tuples(
            st.just("enqueue"),
            st.integers(3, 60),
            st.integers(1, 12),
            st.sampled_from(KINDS),
            st.none() | st.integers(0, 4),
        ),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("sleep"), st.integers(0, 20)),
        st.tuples(st.just("close")),
    ),
    min_size=1,
    max_size=14,
)


def settings_for(kind: str, vocab: int) -> SamplerSettings:
    if kind == "fail":
        return marked(FAIL)
    if kind == "die":
        return marked(DIE)
    if kind == "no_logit":  # sampling finds nothing to draw: this job fails in iterate()
        return SamplerSettings(token_bias=torch.full((vocab,), -torch.inf))
    return GREEDY


async def consume(job, break_after: int | None) -> tuple[list[dict], str, BaseException | None]:
    results = []
    try:
        async for r in job:
            results.append(r)
            if break_after is not None and len(results) > break_after:
                return results, "break", None
    except Exception as e:
        return results, "error", e
    return results, "end", None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
def test_random_enqueue_cancel_break_close_and_failures_end_every_job_once_and_free_every_page(tiny_model, operations):
    vocab = tiny_model.config.vocab_size

    async def main():
        gen = make(tiny_model, pages=24, max_chunk_size=7)
        jobs: list[tuple[DynamicJobAsync, str, asyncio.Task]] = []
        cancelled: set[int] = set()
        closed = may_die = False  # may_die: a job that stops the engine thread when admitted was enqueued
        for op in operations:
            if op[0] == "enqueue":
                _, token, n, kind, break_after = op
                try:
                    job = DynamicJobAsync(gen, torch.tensor([[token] * 5]), n, gen_settings=settings_for(kind, vocab))
                except GeneratorClosedError:
                    assert closed or may_die
                    continue
                assert not closed
                jobs.append((job, kind, asyncio.create_task(consume(job, break_after))))
                may_die = may_die or kind == "die"
            elif op[0] == "cancel" and jobs:
                i = op[1] % len(jobs)
                cancelled.add(i)
                await jobs[i][0].cancel()
            elif op[0] == "sleep":
                await asyncio.sleep(op[1] / 1000)
            elif op[0] == "close":
                await asyncio.wait_for(gen.close(), 30)
                closed = True
        outs = await asyncio.wait_for(asyncio.gather(*(t for _, _, t in jobs)), 60)
        await asyncio.wait_for(gen.close(), 30)
        assert not gen._thread.is_alive()

        for i, ((job, kind, _), (results, how, error)) in enumerate(zip(jobs, outs)):
            eos = [r for r in results if r["eos"]]
            assert len(eos) <= 1 and (not eos or results[-1] is eos[0]), f"job {i}: eos not last or twice"
            assert job.queue.qsize() == 0, f"job {i}: items after its end"
            if how == "break":
                continue
            if eos:
                assert how == "end" and kind == "ok" and eos[0]["new_tokens"] == job.job.max_new_tokens
            elif how == "end":  # a quiet end is what cancel() promises, and nothing else
                assert i in cancelled and job.cancelled, f"job {i} ({kind}) ended with no eos and no error"
            elif isinstance(error, GeneratorClosedError):
                assert closed or may_die, f"job {i} ({kind}): {error!r}"
            elif kind == "fail":
                assert isinstance(error, ValueError) and "dry_sequence_breakers" in str(error)
            else:
                assert kind == "no_logit" and "no finite logit" in str(error), f"job {i} ({kind}): {error!r}"
        assert gen.jobs == {} and gen.generator.num_remaining_jobs() == 0
        assert pages_in_use(gen) == 0

    asyncio.run(main())
