"""One place that picks a backend per op.

Each op has an ordered list of candidates. A candidate is a function with the op's signature that returns
None when it cannot handle the inputs (device, dtype, head size, ...); the torch twin, last, always accepts.
Setting TANDEM_FORCE_REFERENCE=1 (read when an op is first dispatched) skips straight to the twins.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

_candidates: dict[str, list[Callable[..., Any]]] = {}
_force_reference: bool | None = None


def register(op: str, fn: Callable[..., Any], *, reference: bool = False) -> None:
    """Add a backend for `op`. The reference (torch twin) always goes last; others in registration order."""
    chain = _candidates.setdefault(op, [])
    if reference:
        chain.append(fn)
        fn.__tandem_reference__ = True  # type: ignore[attr-defined]
    else:
        idx = next((i for i, c in enumerate(chain) if getattr(c, "__tandem_reference__", False)), len(chain))
        chain.insert(idx, fn)


def candidates(op: str) -> list[Callable[..., Any]]:
    global _force_reference
    if _force_reference is None:
        _force_reference = os.environ.get("TANDEM_FORCE_REFERENCE", "") not in ("", "0")
    chain = _candidates[op]
    if _force_reference:
        return [c for c in chain if getattr(c, "__tandem_reference__", False)]
    return chain


def call(op: str, *args: Any, **kwargs: Any) -> Any:
    for fn in candidates(op):
        out = fn(*args, **kwargs)
        if out is not None:
            return out
    raise RuntimeError(f"no backend accepted op {op!r}; the torch reference should always accept")
