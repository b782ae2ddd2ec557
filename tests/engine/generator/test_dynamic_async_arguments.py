"""The async wrappers and the exllamav2 generators take the engine classes' parameters by name, with the same
defaults, so a misspelled keyword is a TypeError at the call instead of a setting silently dropped."""

from __future__ import annotations

import asyncio
import inspect

import pytest
import torch

from engine.cache import Cache
from engine.compat.exllamav2 import ExLlamaV2DynamicGenerator, ExLlamaV2DynamicGeneratorAsync
from engine.generator.dynamic import DynamicGenerator
from engine.generator.dynamic_async import DynamicGeneratorAsync, DynamicJobAsync
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings


def parameters(init, skip: int) -> list[tuple[str, object, object]]:
    """(name, kind, default) of `init`'s parameters after the first `skip` (self, an async job's generator)."""
    params = list(inspect.signature(init).parameters.values())[skip:]
    return [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize("wrapper", [DynamicGeneratorAsync, ExLlamaV2DynamicGenerator, ExLlamaV2DynamicGeneratorAsync])
def test_generator_wrappers_take_the_generators_parameters(wrapper):
    assert parameters(wrapper.__init__, 1) == parameters(DynamicGenerator.__init__, 1)
    kinds = {kind for _, kind, _ in parameters(wrapper.__init__, 1)}
    assert kinds == {inspect.Parameter.POSITIONAL_OR_KEYWORD}  # no *args or **kwargs to swallow a typo


def test_the_async_job_takes_the_jobs_parameters():
    assert parameters(DynamicJobAsync.__init__, 2) == parameters(DynamicJob.__init__, 1)
    assert list(inspect.signature(DynamicJobAsync.__init__).parameters)[1] == "generator"


def test_a_misspelled_keyword_is_a_type_error(tiny_model):
    cache = Cache(tiny_model, max_seq_len=64 * 16, page_size=16)
    with pytest.raises(TypeError, match="max_batchsize"):
        DynamicGeneratorAsync(tiny_model, cache, tiny_model.tokenizer, max_batchsize=2)
    with pytest.raises(TypeError, match="num_draft_token"):
        ExLlamaV2DynamicGenerator(tiny_model, cache, tiny_model.tokenizer, num_draft_token=2)

    async def main():
        gen = DynamicGeneratorAsync(tiny_model, cache, tiny_model.tokenizer, max_batch_size=2)
        try:
            with pytest.raises(TypeError, match="stop_condition"):
                DynamicJobAsync(gen, torch.tensor([[5, 6, 7]]), 4, stop_condition=[2])
            # Nothing was queued by the call that failed; a correct one runs with its settings.
            assert gen.generator.num_remaining_jobs() == 0 and not gen.jobs
            job = DynamicJobAsync(gen, [5, 6, 7], 4, gen_settings=SamplerSettings.greedy(), identifier="ok")
            results = [r async for r in job]
            assert gen.generator.max_batch_size == 2
            assert results[-1]["eos"] and results[-1]["identifier"] == "ok" and results[-1]["new_tokens"] == 4
        finally:
            await gen.close()

    asyncio.run(main())
