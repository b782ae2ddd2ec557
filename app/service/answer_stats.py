"""The numbers an answer keeps, from the engine's (or a backend's) result dicts: one rate, one way.

Tokens per second is (new_tokens - 1) / time_generate: the engine's time_generate runs from the first
token to the last, so it spans new_tokens - 1 decode steps (the first token's time is prefill's, reported
as time to first token). Dividing n by it would count one token too many, most visibly on short answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def tokens_per_second(new_tokens: int, seconds: float) -> float | None:
    """Decode rate of `new_tokens` whose first and last arrived `seconds` apart; None when that says nothing
    (one token or none, or no time)."""
    if seconds <= 0 or new_tokens < 2:
        return None
    return (new_tokens - 1) / seconds


def eos_stats(result: Mapping[str, Any], json_mode: bool = False) -> dict[str, Any]:
    """The statistics an answer keeps, from its eos result (and whether JSON mode held it)."""
    generate = float(result.get("time_generate", 0.0))
    new_tokens = int(result.get("new_tokens", 0))
    extra: dict[str, Any] = {"json_mode": True} if json_mode else {}
    for key in ("accepted_draft_tokens", "rejected_draft_tokens"):  # only when the generator speculates
        if key in result:
            extra[key] = int(result[key])
    return {
        "new_tokens": new_tokens,
        "prompt_tokens": int(result.get("prompt_tokens", 0)),
        "cached_tokens": int(result.get("cached_tokens", 0)),
        "tokens_per_second": tokens_per_second(new_tokens, generate),
        "time_to_first_token": float(result.get("time_enqueued", 0.0)) + float(result.get("time_prefill", 0.0)),
        "time_generate": generate,
        "eos_reason": result.get("eos_reason"),
        **extra,
    }
