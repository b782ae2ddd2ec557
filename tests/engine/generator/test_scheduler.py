"""The scheduler's token budget per step: decode tokens first, prefill chunks share the rest in admission order."""

from __future__ import annotations

import pytest

from engine.cache.manager import CacheManager
from engine.generator.scheduler import Scheduler, Seq


def make_seq(serial: int, num_prompt: int, first: int, **kw) -> Seq:
    return Seq(serial, list(range(first, first + num_prompt)), num_prompt, 4, max_skips=4, **kw)


def admitted(scheduler: Scheduler, *seqs: Seq) -> Scheduler:
    scheduler.waiting.extend(seqs)
    done, _ = scheduler.admit()
    assert done == list(seqs)
    return scheduler


def fed(scheduler: Scheduler) -> list[int]:
    return [len(step.token_ids) for step in scheduler.plan()]


def test_decode_tokens_are_counted_first_and_prefills_share_the_rest():
    scheduler = Scheduler(CacheManager(32, 4), max_batch_size=4, max_chunk_size=8, max_step_tokens=10)
    a, b = make_seq(0, 20, 10), make_seq(1, 20, 40)
    last = make_seq(2, 1, 70)  # one prompt token left: a single-token step, like a decode
    admitted(scheduler, a, b, last)
    assert fed(scheduler) == [8, 1, 1]


def test_the_default_budget_never_cuts_a_chunk():
    scheduler = Scheduler(CacheManager(32, 4), max_batch_size=3, max_chunk_size=8)
    assert scheduler.max_step_tokens == 24
    admitted(scheduler, make_seq(0, 20, 10), make_seq(1, 20, 40), make_seq(2, 20, 70))
    assert fed(scheduler) == [8, 8, 8]


def test_a_cfg_half_that_waits_for_its_pair_takes_no_budget():
    scheduler = Scheduler(CacheManager(32, 4), max_batch_size=4, max_chunk_size=8, max_step_tokens=16)
    positive = make_seq(0, 3, 10)  # its final chunk needs logits, which must wait for the negative's
    positive.negative = make_seq(0, 20, 40, shadow=True)
    other = make_seq(1, 20, 70)
    admitted(scheduler, positive, other)
    steps = scheduler.plan()
    assert [(s.seq.shadow, s.seq.serial, len(s.token_ids)) for s in steps] == [(True, 0, 8), (False, 1, 8)]


def test_a_budget_below_the_batch_size_is_refused():
    with pytest.raises(ValueError, match="max_step_tokens"):
        Scheduler(CacheManager(32, 4), max_batch_size=4, max_chunk_size=8, max_step_tokens=3)
