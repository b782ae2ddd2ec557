"""How much KV cache a served model gets. Requests are admitted while the cache's free pages hold their prompt and
completion (the generator's rule), so the cache's size, not a count of requests, decides how many run at once:
many short ones, or a few that fill the context."""

from __future__ import annotations

PAGE_SIZE = 256
CACHE_TOKENS = 32768  # the default: 128 pages of 256, 0.75 GB for the starter in bfloat16


def cache_size(context: int, budget: int | None = None, page_size: int = PAGE_SIZE) -> int:
    """Tokens of KV cache: the budget (CACHE_TOKENS by default), but at least one full context, in whole pages."""
    tokens = max(context, CACHE_TOKENS if budget is None else budget)
    return -(-tokens // page_size) * page_size
