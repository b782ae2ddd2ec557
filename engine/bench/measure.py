"""What each bench side measures with: peak memory, the CPU time other programs took, best-of timing."""

from __future__ import annotations

import math
import sys
from pathlib import Path

WARMUP_TOKENS = 4
BUSY_WAIT_SHARE = 0.10  # above this share of time waiting for a CPU, the timings are called unreliable
SINGLE_RUNS = 2  # single-stream figures are the best of this many runs (other processes add noise)


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (MiB), or NaN where the OS does not say."""
    try:
        import resource
    except ImportError:  # Windows
        return math.nan
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


_SCHED_AT_START: dict[str, tuple[int, int]] = {}  # a side's threads' scheduler times when its run began


def _sched_times() -> dict[str, tuple[int, int]]:
    """Per thread of this process: (ns on a CPU, ns runnable but waiting for one). Empty off Linux."""
    times = {}
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        try:
            on_cpu, waiting = stat.read_text().split()[:2]
        except (OSError, ValueError):  # the thread ended meanwhile
            continue
        times[stat.parent.name] = (int(on_cpu), int(waiting))
    return times


def mark_start() -> None:
    """Note this side's scheduler times: `cpu_wait_share` counts from here."""
    _SCHED_AT_START.clear()
    _SCHED_AT_START.update(_sched_times())


def cpu_wait_share(before: dict[str, tuple[int, int]] | None = None) -> float:
    """Share of this process's runnable time since `before` (default: `mark_start`) spent waiting for a CPU
    (other load), or NaN."""
    before = _SCHED_AT_START if before is None else before
    on_cpu = waiting = 0
    for tid, (run, wait) in _sched_times().items():
        run0, wait0 = before.get(tid, (0, 0))
        on_cpu, waiting = on_cpu + run - run0, waiting + wait - wait0
    return waiting / (on_cpu + waiting) if on_cpu + waiting else math.nan


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def best_of(n: int, fn) -> float:
    return min(fn() for _ in range(n))
