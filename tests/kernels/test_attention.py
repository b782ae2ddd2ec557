"""Paged attention (torch twin) against dense causal attention, with and without the page-run hint, on a plain
cache and on the CPU cache's head-major memory (a strided view); writing K/V into both layouts."""

from __future__ import annotations

import pytest
import torch

from kernels import ops


def dense(q, k, v, scale, window=None):
    """q [Lq, Hq, D] are the last Lq positions of k/v [L, Hkv, D]; causal (and windowed) attention in fp32."""
    lq, hq, _ = q.shape
    length, hkv, _ = k.shape
    k = k.float().repeat_interleave(hq // hkv, dim=1)
    v = v.float().repeat_interleave(hq // hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    qpos = torch.arange(length - lq, length)[:, None]
    kpos = torch.arange(length)[None, :]
    allowed = kpos <= qpos
    if window is not None:
        allowed &= kpos > qpos - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """The same values with the memory order `Cache` uses on the CPU: [pages, heads, slots, dim] underneath."""
    return cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


def scenario(seq_lens, query_lens, tables, page_size=4, hq=4, hkv=2, d=16, dtype=torch.float32, seed=0, strided=False):
    g = torch.Generator().manual_seed(seed)
    num_pages = max(max(t) for t in tables) + 1
    k_cache = torch.randn(num_pages, page_size, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(num_pages, page_size, hkv, d, generator=g).to(dtype)
    if strided:
        k_cache, v_cache = head_major(k_cache), head_major(v_cache)
    q = torch.randn(sum(query_lens), hq, d, generator=g).to(dtype)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    return q, k_cache, v_cache, block_tables


def seq_kv(cache, table, length):
    return cache[table].reshape(-1, *cache.shape[2:])[:length]


def runs_of(tables, seq_lens, page_size):
    out = []
    for t, n in zip(tables, seq_lens):
        used = t[: (n + page_size - 1) // page_size]
        out.append(used[0] if used == list(range(used[0], used[0] + len(used))) else -1)
    return out


CASES = {
    "decode one contiguous": ([9], [1], [[3, 4, 5]]),
    "decode one scattered": ([9], [1], [[5, 0, 3]]),
    "decode batch contiguous": ([9, 4, 13], [1, 1, 1], [[0, 1, 2], [3], [4, 5, 6, 7]]),
    "decode batch mixed": ([9, 4, 13], [1, 1, 1], [[0, 1, 2], [9], [4, 8, 6, 7]]),
    "prefill after cached pages": ([11, 6], [5, 6], [[2, 3, 4], [7, 8]]),
    "prefill scattered": ([11, 6], [5, 6], [[4, 2, 3], [8, 0]]),
}


@pytest.mark.parametrize("strided", [False, True], ids=["plain", "head-major"])
@pytest.mark.parametrize("hint", [True, False], ids=["runs", "no-runs"])
@pytest.mark.parametrize("name", list(CASES))
def test_paged_attention_matches_dense(name, hint, strided):
    seq_lens, query_lens, tables = CASES[name]
    q, k_cache, v_cache, block_tables = scenario(seq_lens, query_lens, tables, strided=strided)
    runs = runs_of(tables, seq_lens, 4) if hint else None
    out = ops.paged_attention(
        q, k_cache, v_cache, block_tables, torch.tensor(seq_lens), query_lens, seq_lens, 0.25, None, runs
    )
    start = 0
    for table, n, lq in zip(tables, seq_lens, query_lens):
        ref = dense(q[start : start + lq], seq_kv(k_cache, table, n), seq_kv(v_cache, table, n), 0.25)
        torch.testing.assert_close(out[start : start + lq].float(), ref, atol=1e-5, rtol=1e-5)
        start += lq


@pytest.mark.parametrize("strided", [False, True], ids=["plain", "head-major"])
def test_sliding_window_decode_and_prefill(strided):
    seq_lens, query_lens, tables = [13, 10], [1, 4], [[0, 1, 2, 3], [6, 5, 4]]
    q, k_cache, v_cache, block_tables = scenario(seq_lens, query_lens, tables, seed=3, strided=strided)
    out = ops.paged_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        torch.tensor(seq_lens),
        query_lens,
        seq_lens,
        0.25,
        5,
        runs_of(tables, seq_lens, 4),
    )
    start = 0
    for table, n, lq in zip(tables, seq_lens, query_lens):
        ref = dense(q[start : start + lq], seq_kv(k_cache, table, n), seq_kv(v_cache, table, n), 0.25, window=5)
        torch.testing.assert_close(out[start : start + lq].float(), ref, atol=1e-5, rtol=1e-5)
        start += lq


def test_bfloat16_decode_with_runs_is_close():
    seq_lens, query_lens, tables = [300, 70], [1, 1], [list(range(0, 19)), list(range(19, 24))]
    q, k_cache, v_cache, block_tables = scenario(seq_lens, query_lens, tables, page_size=16, dtype=torch.bfloat16)
    out = ops.paged_attention(
        q, k_cache, v_cache, block_tables, torch.tensor(seq_lens), query_lens, seq_lens, 0.25, None, [0, 19]
    )
    for i, (table, n) in enumerate(zip(tables, seq_lens)):
        ref = dense(q[i : i + 1], seq_kv(k_cache, table, n), seq_kv(v_cache, table, n), 0.25)
        torch.testing.assert_close(out[i : i + 1].float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("strided", [False, True], ids=["plain", "head-major"])
def test_write_kv_puts_rows_at_their_slots(strided):
    k_cache = torch.zeros(3, 4, 2, 8)
    v_cache = torch.zeros(3, 4, 2, 8)
    if strided:
        k_cache, v_cache = head_major(k_cache), head_major(v_cache)
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    slots = torch.tensor([0, 5, 6, 11, 3])
    ops.write_kv(k_cache, v_cache, k, v, slots)
    for row, slot in enumerate(slots.tolist()):
        assert torch.equal(k_cache[slot // 4, slot % 4], k[row]) and torch.equal(v_cache[slot // 4, slot % 4], v[row])
    assert k_cache.abs().sum(dim=(2, 3)).count_nonzero() == 5  # nothing else written


def test_single_sequence_decode_over_several_head_major_pages():
    seq_lens, query_lens, tables = [11], [1], [[1, 2, 3]]
    q, k_cache, v_cache, block_tables = scenario(seq_lens, query_lens, tables, seed=5, strided=True)
    out = ops.paged_attention(
        q, k_cache, v_cache, block_tables, torch.tensor(seq_lens), query_lens, seq_lens, 0.25, None, [1]
    )
    ref = dense(q, seq_kv(k_cache, tables[0], 11), seq_kv(v_cache, tables[0], 11), 0.25)
    torch.testing.assert_close(out.float(), ref, atol=1e-5, rtol=1e-5)
