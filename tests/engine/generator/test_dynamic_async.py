"""The async wrapper: engine thread, many concurrent jobs, cancel at any time, failures, close."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.dynamic_async import DynamicGeneratorAsync, DynamicJobAsync, GeneratorClosedError
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings

GREEDY = SamplerSettings.greedy()


def make(model, **kw):
    return DynamicGeneratorAsync(model, Cache(model, max_seq_len=64 * 16, page_size=16), model.tokenizer, **kw)


async def collect(job) -> list[dict]:
    return [r async for r in job]


def ids_of(results):
    return [t for r in results if "token_ids" in r for t in r["token_ids"][0].tolist()]


def test_gather_eight_jobs_equal_sync_runs(tiny_model):
    prompts = [[5 + i] * (3 + 4 * i) for i in range(8)]

    async def main():
        gen = make(tiny_model)
        jobs = [
            DynamicJobAsync(gen, torch.tensor([p]), 12, gen_settings=GREEDY, identifier=i)
            for i, p in enumerate(prompts)
        ]
        out = await asyncio.gather(*(collect(j) for j in jobs))
        await gen.close()
        return out

    out = asyncio.run(main())
    sync = DynamicGenerator(tiny_model, Cache(tiny_model, max_seq_len=64 * 16, page_size=16), tiny_model.tokenizer)
    for i, results in enumerate(out):
        assert results[-1]["eos"] and results[-1]["identifier"] == i
        assert all(r["identifier"] == i for r in results)
        job = DynamicJob(torch.tensor([prompts[i]]), 12, gen_settings=GREEDY)
        sync.enqueue(job)
        ref = []
        while sync.num_remaining_jobs():
            ref += sync.iterate()
        assert ids_of(results) == ids_of(ref)


def test_iterate_never_runs_on_the_event_loop_thread(tiny_model):
    seen_threads = set()

    async def main():
        gen = make(tiny_model)
        original = gen.generator.iterate

        def spy():
            seen_threads.add(threading.get_ident())
            return original()

        gen.generator.iterate = spy
        job = DynamicJobAsync(gen, torch.tensor([[5, 6, 7]]), 6, gen_settings=GREEDY)
        await collect(job)
        await gen.close()
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert seen_threads and loop_thread not in seen_threads


@pytest.mark.timing
def test_event_loop_keeps_ticking_while_jobs_stream(tiny_model):
    async def main():
        gen = make(tiny_model)
        gaps, last = [], time.perf_counter()
        jobs = [DynamicJobAsync(gen, torch.tensor([[5] * 40]), 40, gen_settings=GREEDY) for _ in range(4)]
        task = asyncio.gather(*(collect(j) for j in jobs))
        while not task.done():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        await task
        await gen.close()
        return max(gaps)

    worst = asyncio.run(main())
    # Generous bound: the loop only awaits; a forward pass on it would block for whole steps.
    assert worst < 0.5, f"event loop stalled for {worst:.3f}s"


def test_cancel_mid_stream_and_after_eos(tiny_model):
    async def main():
        gen = make(tiny_model)
        long = DynamicJobAsync(gen, torch.tensor([[5] * 10]), 200, gen_settings=GREEDY)
        got = []
        async for r in long:
            got.append(r)
            if sum(len(x.get("text", "")) for x in got) and len(ids_of(got)) >= 3:
                await long.cancel()
        assert not got[-1]["eos"] and long.cancelled
        short = DynamicJobAsync(gen, torch.tensor([[6] * 4]), 3, gen_settings=GREEDY)
        results = await collect(short)
        assert results[-1]["eos"]
        await short.cancel()  # after eos: harmless
        again = DynamicJobAsync(gen, torch.tensor([[7] * 4]), 3, gen_settings=GREEDY)
        assert (await collect(again))[-1]["eos"]
        await gen.close()
        assert gen.generator.page_table.referenced_pages() == []

    asyncio.run(main())


def test_failure_reaches_only_the_affected_job(tiny_model):
    async def main():
        gen = make(tiny_model)
        good = DynamicJobAsync(gen, torch.tensor([[5] * 8]), 10, gen_settings=GREEDY, identifier="good")
        # A bias of -inf on every token leaves this job nothing to draw: sampling fails for it alone.
        bad_settings = SamplerSettings(token_bias=torch.full((tiny_model.config.vocab_size,), -torch.inf))
        bad = DynamicJobAsync(gen, torch.tensor([[6] * 8]), 10, gen_settings=bad_settings, identifier="bad")
        good_out, bad_out = await asyncio.gather(collect(good), collect(bad), return_exceptions=True)
        assert isinstance(bad_out, ValueError) and "no finite logit" in str(bad_out)
        assert good_out[-1]["eos"] and good_out[-1]["new_tokens"] == 10
        later = DynamicJobAsync(gen, torch.tensor([[7] * 8]), 4, gen_settings=GREEDY)
        assert (await collect(later))[-1]["eos"]  # the generator keeps serving
        await gen.close()

    asyncio.run(main())


def test_close_ends_every_job_and_joins_the_thread(tiny_model):
    async def main():
        gen = make(tiny_model)
        jobs = [DynamicJobAsync(gen, torch.tensor([[5] * 8]), 500, gen_settings=GREEDY) for _ in range(3)]
        tasks = [asyncio.create_task(collect(j)) for j in jobs]
        await asyncio.sleep(0.2)
        await gen.close()
        outs = await asyncio.gather(*tasks, return_exceptions=True)
        # Each ends with a clear outcome: the iteration raises, never stops as if the answer were whole.
        assert all(isinstance(o, GeneratorClosedError) and "closed" in str(o) for o in outs)
        assert not gen._thread.is_alive()
        assert gen.generator.page_table.referenced_pages() == []
        with pytest.raises(RuntimeError, match="closed"):
            DynamicJobAsync(gen, torch.tensor([[5]]), 2)

    asyncio.run(main())


def test_oversize_job_fails_in_the_caller(tiny_model):
    async def main():
        gen = make(tiny_model)
        with pytest.raises(ValueError, match="cache pages"):
            DynamicJobAsync(gen, torch.tensor([[5] * 100]), 2000)
        await gen.close()

    asyncio.run(main())


def test_closed_error_is_a_public_name():
    # Users of DynamicGeneratorAsync catch it, so it comes from `engine` like the generator itself.
    import engine

    assert engine.GeneratorClosedError is GeneratorClosedError and "GeneratorClosedError" in engine.__all__


def test_put_result_eos_is_the_jobs_last_item(tiny_model):
    async def main():
        gen = make(tiny_model)
        job = DynamicJobAsync(gen, torch.tensor([[5] * 8]), 30, gen_settings=GREEDY)
        # No await since the job was made, so the engine thread's results have not reached the loop yet.
        await job.put_result({"serial": job.job.serial, "eos": True, "text": "pushed"})
        first = await collect(job)
        await asyncio.sleep(0.2)  # the engine's own results arrive after the pushed eos and are dropped
        again = await collect(job)
        await job.cancel()
        await gen.close()
        return first, again

    first, again = asyncio.run(main())
    assert [r["text"] for r in first] == ["pushed"] and again == []
