"""How many threads the engine computes on: every core while the machine is quiet, one fewer for each core
other programs keep busy.

torch's OpenMP workers (which the C kernels share) spin at every barrier. When another program holds a core,
a worker waiting on that core makes the others spin through their time slices, and a step takes several
times longer than on one thread fewer. Waiting passively instead (OMP_WAIT_POLICY, read once when torch
loads) would cost a large share of the quiet speed on every step.

So the generator asks `ThreadPolicy.update` before each step. Every half second it compares how much CPU
time the whole machine used (/proc/stat) with what this process used: the difference is other programs'
load, in cores. Threads = the cores this process may use minus that load, rounded, at least one. Where
/proc/stat cannot be read (macOS, Windows) the thread count is left alone.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

INTERVAL_S = 0.5
# Another program's load (in cores) from which a core counts as taken: a busy loop shows as 0.7-1.0 while
# our workers spin beside it, background daemons as a few hundredths.
TAKEN_FROM = 0.5


def machine_busy_seconds() -> float | None:
    """CPU seconds all programs have run (user, nice, system, irq, softirq) since boot, or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class ThreadPolicy:
    """Sets torch's thread count (and so the C kernels') from other programs' load; see the module docstring.

    `max_threads` defaults to torch's count when the policy is made (the cores, or what the user chose).
    `busy_seconds` and `clock` are the machine's counters, replaceable for a test that fakes a load.
    """

    def __init__(
        self,
        max_threads: int | None = None,
        busy_seconds: Callable[[], float | None] = machine_busy_seconds,
        own_seconds: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_threads = max_threads or torch.get_num_threads()
        self.threads = self.max_threads
        self.others = 0.0  # other programs' load at the last reading, in cores
        self._busy_seconds, self._own_seconds, self._clock = busy_seconds, own_seconds, clock
        self._last = self._reading()

    def _reading(self) -> tuple[float, float | None, float]:
        return self._clock(), self._busy_seconds(), self._own_seconds()

    def update(self) -> int:
        """The thread count for the next step (set in torch when it changes)."""
        now = self._clock()
        if now - self._last[0] < INTERVAL_S:
            return self.threads
        reading = self._reading()
        (then, busy_then, own_then), self._last = self._last, reading
        if busy_then is None or reading[1] is None:
            return self.threads
        elapsed = reading[0] - then
        self.others = max(0.0, (reading[1] - busy_then) - (reading[2] - own_then)) / elapsed
        taken = int(self.others + 1.0 - TAKEN_FROM)  # rounds up from TAKEN_FROM of a core
        threads = max(1, min(self.max_threads, _cores() - taken))
        if threads != self.threads:
            log.info("other programs keep %.1f cores busy: computing on %d thread(s)", self.others, threads)
            self.threads = threads
        if torch.get_num_threads() != threads:  # torch's count is process-wide: another policy may have moved it
            torch.set_num_threads(threads)
        return threads


_shared: ThreadPolicy | None = None


def shared_policy() -> ThreadPolicy:
    """The process's one policy (torch's thread count is process-wide), made on first use, so a generator made
    while another had lowered the count still knows the count to come back to."""
    global _shared
    if _shared is None:
        _shared = ThreadPolicy()
    return _shared
