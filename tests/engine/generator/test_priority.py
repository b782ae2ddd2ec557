"""DynamicJob.priority: waiting jobs of a higher priority are admitted first, equal ones in arrival order; a
running job is never preempted.

Bad inputs tried: a cache with room for one job at a time and three waiting, a bool and a float as priority.
"""

from __future__ import annotations

import pytest

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings


def _job(name: str, priority: int = 0) -> DynamicJob:
    # 40 prompt tokens + 40 new: 5 pages of 16, so a 8-page cache runs one job at a time
    return DynamicJob(
        list(range(5, 45)),
        40,
        min_new_tokens=40,
        gen_settings=SamplerSettings.greedy(),
        identifier=name,
        priority=priority,
    )


def test_higher_priority_jobs_are_admitted_first_and_equal_ones_in_order(tiny_model):
    gen = DynamicGenerator(tiny_model, Cache(tiny_model, max_seq_len=128, page_size=16), tiny_model.tokenizer)
    gen.enqueue(_job("running"))
    gen.iterate()  # admitted alone: the others arrive while it runs
    gen.enqueue([_job("low-1", -1), _job("plain-1"), _job("low-2", -1), _job("high", 5), _job("plain-2")])
    started: list[str] = []
    while gen.num_remaining_jobs():
        for result in gen.iterate():
            if result["stage"] == "streaming" and result["identifier"] not in started:
                started.append(result["identifier"])
    assert started == ["running", "high", "plain-1", "plain-2", "low-1", "low-2"]


@pytest.mark.parametrize("priority", [True, 1.5, "1"])
def test_priority_must_be_an_int(priority):
    with pytest.raises(ValueError, match="priority must be an int"):
        DynamicJob([1, 2, 3], 4, priority=priority)
