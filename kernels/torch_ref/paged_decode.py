"""Decode attention (one query per sequence) over paged K/V, page by page, in plain torch.

On a CPU the cost of decode attention is call overhead and copying, not arithmetic: gathering each
sequence's pages into a padded [batch, max_len] block and running small bf16 matmuls on permuted views took
most of a decode step with 16 jobs. Here every (sequence, page) pair is one unit of a single batched matmul:

    scores[u] = q[seq(u)] . K[page(u)]         [units, Hkv, group, page_size]
    o[u], m[u], l[u] = softmax pieces of unit u (its max, its sum of exp, its exp-weighted values)
    out[s] = sum over units of s of exp(m[u] - M[s]) * o[u] / sum of exp(m[u] - M[s]) * l[u]

which is split-K softmax (as in flash-decoding) with the page as the split. When the units' pages are one
run of page ids, each used once, K and V are read as a view of the cache with no copy at all; otherwise
(pages shared by a prefix, scattered ids) the unit pages are gathered, still without padding.

The plan (which units, their sequences and valid lengths) depends only on the page tables and lengths, which
every layer of a step shares, so it is built once per step and reused by the other layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# A finite stand-in for -inf in a unit's max, so a unit with no visible key yields zero weight, not NaN.
_NO_KEYS = -1e30
# Gap pages (free, or other sequences' pages outside this batch) read as masked units when they are at most
# this share of the run; beyond it a gather of only the used pages is cheaper.
_MAX_GAP_SHARE = 0.5


@dataclass(frozen=True)
class DecodePlan:
    """Units of work for one step's decode attention; built on the host, shared by all layers."""

    first_page: int  # units are pages first_page.. of the cache when `gather` is None
    gather: torch.Tensor | None  # [units] page ids to gather, when the pages are not one run
    unit_seq: torch.Tensor  # [units] int64: the sequence each unit belongs to
    unit_start: torch.Tensor  # [units] int64: first visible position in the unit's page
    unit_end: torch.Tensor  # [units] int64: one past the last visible position (0 for gap units)
    num_units: int
    hidden: torch.Tensor  # [units, page_size] float32: -inf at slots a unit's query must not see, else 0
    # what the plan was built from, to check a cached plan still applies
    seq_lens: tuple[int, ...]
    sliding_window: int | None


def build_plan(
    block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], page_size: int, sliding_window: int | None
) -> DecodePlan:
    """Which pages each sequence reads for its one query at position seq_len - 1, and which of their slots."""
    units: list[tuple[int, int, int, int]] = []  # (page id, seq, start, end)
    for seq, (table, length) in enumerate(zip(block_tables, seq_lens)):
        lowest = 0 if sliding_window is None else max(0, length - sliding_window)  # first visible position
        for j in range(lowest // page_size, (length + page_size - 1) // page_size):
            start = max(0, lowest - j * page_size)
            units.append((int(table[j]), seq, start, min(page_size, length - j * page_size)))
    units.sort()
    pages = [u[0] for u in units]
    first, span = pages[0], pages[-1] - pages[0] + 1
    distinct = len(set(pages)) == len(pages)
    if distinct and span - len(pages) <= _MAX_GAP_SHARE * len(pages):
        # One run of page ids: units are every page of it, in order; the gaps are units with nothing visible.
        by_page = {u[0]: u for u in units}
        units = [by_page.get(first + i, (first + i, 0, 0, 0)) for i in range(span)]
        gather = None
    else:
        gather = torch.tensor(pages, dtype=torch.int64)

    def column(i: int) -> torch.Tensor:
        return torch.tensor([u[i] for u in units], dtype=torch.int64)

    starts, ends = column(2), column(3)
    slot = torch.arange(page_size)
    outside = (slot < starts[:, None]) | (slot >= ends[:, None])
    hidden = torch.zeros(outside.shape).masked_fill_(outside, float("-inf"))
    return DecodePlan(first, gather, column(1), starts, ends, len(units), hidden, tuple(seq_lens), sliding_window)


class _PlanCache:
    """The last plan, kept while equal page tables and lengths come back (the other layers of a step).

    The tables are compared by value: a scheduler may edit a table tensor in place, and tensors made under
    inference mode carry no version counter to tell.
    """

    def __init__(self) -> None:
        self._tables: torch.Tensor | None = None
        self._page_size = 0
        self._plan: DecodePlan | None = None

    def get(
        self, block_tables: torch.Tensor, seq_lens: Sequence[int], page_size: int, sliding_window: int | None
    ) -> DecodePlan:
        plan, tables = self._plan, self._tables
        if (
            plan is not None
            and tables is not None
            and plan.seq_lens == tuple(seq_lens)
            and plan.sliding_window == sliding_window
            and self._page_size == page_size
            and tables.shape == block_tables.shape
            and tables.device == block_tables.device
            and torch.equal(tables, block_tables)
        ):
            return plan
        plan = build_plan(block_tables.tolist(), seq_lens, page_size, sliding_window)
        self._tables, self._page_size, self._plan = block_tables.clone(), page_size, plan
        return plan


_plans = _PlanCache()


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Attention of each sequence's single query q[i] [Hq, D] over its seq_lens_host[i] cached keys (within
    the sliding window when one is set) -> [num_seqs, Hq, D] in the cache dtype."""
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    plan = _plans.get(block_tables, seq_lens_host, page_size, sliding_window)
    device = q.device
    unit_seq = plan.unit_seq.to(device)
    if plan.gather is None:
        k = k_cache.narrow(0, plan.first_page, plan.num_units)
        v = v_cache.narrow(0, plan.first_page, plan.num_units)
    else:
        pages = plan.gather.to(device)
        k, v = k_cache.index_select(0, pages), v_cache.index_select(0, pages)
    # Query heads are grouped by the KV head they share: head h reads KV head h // group.
    qu = q.to(k.dtype).view(num_seqs, num_kv_heads, group, head_dim).index_select(0, unit_seq)
    # Head-major pages: CPU bf16 matmuls on permuted views took twice as long as a copy plus the matmul. The
    # CPU cache's memory is head-major already (engine/cache/cache.py), so there these are views, not copies.
    k = k.permute(0, 2, 1, 3).contiguous()  # [U, Hkv, page_size, D]
    v = v.permute(0, 2, 1, 3).contiguous()
    scores = torch.matmul(qu, k.transpose(-1, -2)).float()  # [U, Hkv, group, page_size]
    scores.mul_(scale).add_(plan.hidden.to(device)[:, None, None, :])
    unit_max = scores.amax(dim=-1).clamp_min(_NO_KEYS)  # [U, Hkv, group]
    weights = torch.exp(scores - unit_max[..., None])
    unit_sum = weights.sum(dim=-1)
    unit_out = torch.matmul(weights.to(v.dtype), v).float()  # [U, Hkv, group, D]
    seq_max = torch.full((num_seqs, num_kv_heads, group), _NO_KEYS, device=device)
    seq_max.scatter_reduce_(0, unit_seq[:, None, None].expand_as(unit_max), unit_max, "amax")
    rescale = torch.exp(unit_max - seq_max.index_select(0, unit_seq))  # [U, Hkv, group]
    total = torch.zeros(num_seqs, num_kv_heads, group, head_dim, device=device)
    total.index_add_(0, unit_seq, unit_out * rescale[..., None])
    norm = torch.zeros(num_seqs, num_kv_heads, group, device=device).index_add_(0, unit_seq, unit_sum * rescale)
    return (total / norm[..., None]).view(num_seqs, num_q_heads, head_dim).to(k_cache.dtype)
