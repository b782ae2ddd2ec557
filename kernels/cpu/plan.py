"""A decode step kept as a list of C kernel calls over fixed buffers, replayed with one Python loop.

A small model's decode step is mostly overhead, not arithmetic: through the modules and the op dispatch, each
of a 30-layer model's ~300 kernel calls spends more time in Python than in its C code. A plan binds each
call's arguments once (`bind_*` in blocks.py, elementwise.py and attention.py: the same argument lists their
ops use, so a plan computes exactly what the ops compute) to buffers that live as long as the plan; a step then refills
the few inputs that change (token embeddings, rotary rows, page tables, lengths, slots) and runs the calls.

The thread count is one shared ctypes integer in every call's arguments, read from torch before each run,
so the thread policy (engine/threads.py) still takes effect at once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch


class PlanError(RuntimeError):
    """A kernel in a plan declined at run time (out of memory inside it): the step must not be trusted."""


class Plan:
    def __init__(self) -> None:
        self.threads = ctypes.c_int64(torch.get_num_threads())
        self._calls: list[tuple[Callable[..., object], tuple]] = []
        self._buffers: list[torch.Tensor] = []

    def buffer(self, *shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """A tensor the plan keeps alive (its address is bound into calls)."""
        t = torch.zeros(shape, dtype=dtype)
        self._buffers.append(t)
        return t

    def add(self, call: tuple[Callable[..., object], tuple] | None) -> bool:
        """Append a bound kernel call (`bind_*`'s result); False when the kernel declined to bind."""
        if call is None:
            return False
        fn, args = call
        # Made ctypes values once here: converting Python ints at every call would be a large share of a short
        # call's time. The shared thread count is one already.
        argtypes = getattr(fn, "argtypes", None) or ()
        if len(argtypes) == len(args):
            args = tuple(a if isinstance(a, ctypes._SimpleCData) else t(a) for t, a in zip(argtypes, args))
        self._calls.append((fn, args))
        return True

    def add_python(self, fn: Callable[[], object]) -> None:
        """Append a step that is not a C kernel (a torch copy into a cache, say); it must return None or 0."""
        self._calls.append((fn, ()))

    def run(self) -> None:
        self.threads.value = torch.get_num_threads()
        for fn, args in self._calls:
            if fn(*args):  # the kernels return 0 (or nothing) when done
                raise PlanError(f"{getattr(fn, '__name__', fn)} declined inside a decode plan")

    def __len__(self) -> int:
        return len(self._calls)
