"""The thread policy (engine/threads.py): fewer threads while other programs keep cores busy, all of them again
when they stop. Tried: a faked load of 0, 0.1, 0.6, 0.7 and 1 core (counters given to the policy), and a real
busy-loop process beside the test. Speed under load is the bench's to measure, not a test's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from engine import Cache, DynamicGenerator, Model
from engine.threads import ThreadPolicy, machine_busy_seconds


class FakeMachine:
    """Counters the policy reads: the clock, the machine's busy CPU seconds and this process's."""

    def __init__(self):
        self.now, self.busy, self.own = 0.0, 100.0, 10.0

    def run(self, seconds: float, ours: float, others: float) -> None:
        """`seconds` pass with this process using `ours` cores and other programs `others`."""
        self.now += seconds
        self.own += ours * seconds
        self.busy += (ours + others) * seconds

    def policy(self, max_threads: int) -> ThreadPolicy:
        return ThreadPolicy(max_threads, lambda: self.busy, lambda: self.own, lambda: self.now)


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to give one up")
@pytest.mark.parametrize(("others", "taken"), [(0.0, 0), (0.1, 0), (0.6, 1), (0.7, 1), (1.0, 1)])
def test_a_core_other_programs_keep_busy_is_given_up_and_taken_back(restore_threads, others, taken):
    machine = FakeMachine()
    policy = machine.policy(2)
    machine.run(0.6, ours=1.9, others=others)
    assert policy.update() == 2 - taken and torch.get_num_threads() == 2 - taken
    assert policy.others == pytest.approx(others)
    machine.run(0.6, ours=1.0, others=0.0)  # the other program stopped
    assert policy.update() == 2 and torch.get_num_threads() == 2


def test_readings_come_at_most_every_half_second(restore_threads):
    machine = FakeMachine()
    policy = machine.policy(2)
    machine.run(0.2, ours=1.0, others=1.0)
    assert policy.update() == 2  # too soon to judge
    machine.run(0.4, ours=1.0, others=1.0)
    assert policy.update() == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_a_real_busy_loop_beside_us_engages_the_policy(restore_threads):
    assert machine_busy_seconds() is not None
    policy = ThreadPolicy(2)
    busy = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        time.sleep(1.2)  # the loop runs; this process sleeps
        threads = policy.update()
    finally:
        busy.kill()
        busy.wait()
    assert policy.others > 0.5  # the busy loop's core, seen as other programs' load
    assert threads == max(1, min(2, len(os.sched_getaffinity(0)) - 1))


def test_cpu_generators_share_one_policy_and_can_do_without(starter_gguf):
    model = Model.load(starter_gguf)
    first = DynamicGenerator(model, Cache(model, max_seq_len=256, page_size=256), model.tokenizer)
    second = DynamicGenerator(model, Cache(model, max_seq_len=256, page_size=256), model.tokenizer)
    assert first.threads is not None and first.threads is second.threads
    fixed = DynamicGenerator(model, Cache(model, max_seq_len=256, page_size=256), model.tokenizer, adapt_threads=False)
    assert fixed.threads is None


def test_a_reading_puts_torch_back_where_another_policy_left_it(restore_threads):
    # torch's count is process-wide: a generator's shared policy lowered it while a converter ran beside the
    # suite, and a new policy for 2 threads believed torch was at 2 (the full suite failed on it).
    torch.set_num_threads(1)
    machine = FakeMachine()
    policy = machine.policy(2)
    machine.run(0.6, ours=1.9, others=0.0)
    assert policy.update() == 2 and torch.get_num_threads() == 2
