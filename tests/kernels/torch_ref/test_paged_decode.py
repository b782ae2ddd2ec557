"""Page-split decode attention (kernels/torch_ref/paged_decode.py) against dense attention per sequence.

Layouts tried: pages in one run (read as a view), runs with free pages between them (masked gap units),
scattered ids and prefix pages shared by several sequences (gathered), a sliding window that drops whole
pages, sequences of one token, lengths ending exactly on a page boundary; the per-step plan cache with the
page table edited in place, lengths changed, and a new table tensor.
"""

from __future__ import annotations

import random

import pytest
import torch

from kernels.torch_ref import paged_decode
from kernels.torch_ref.paged_decode import build_plan, decode_attention


def dense_decode(q, k_cache, v_cache, tables, lengths, scale, window=None):
    out = []
    for i, (table, n) in enumerate(zip(tables, lengths)):
        k = k_cache[table].reshape(-1, *k_cache.shape[2:])[:n].float()
        v = v_cache[table].reshape(-1, *v_cache.shape[2:])[:n].float()
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("hd,khd->hk", q[i].float(), k) * scale
        if window is not None:
            scores[:, : max(0, n - window)] = float("-inf")
        out.append(torch.einsum("hk,khd->hd", scores.softmax(-1), v))
    return torch.stack(out)


def run_case(tables, lengths, page_size=4, hq=6, hkv=2, d=8, window=None, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    num_pages = max(max(t) for t in tables) + 1
    k_cache = torch.randn(num_pages, page_size, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(num_pages, page_size, hkv, d, generator=g).to(dtype)
    q = torch.randn(len(tables), hq, d, generator=g).to(dtype)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    got = decode_attention(q, k_cache, v_cache, block_tables, lengths, 0.3, window)
    want = dense_decode(q, k_cache, v_cache, [t for t in tables], lengths, 0.3, window)
    return got, want


CASES = {
    "one run": ([[0, 1, 2], [3], [4, 5]], [9, 4, 6]),
    "run with free pages between": ([[0, 1], [3], [6, 7]], [5, 2, 8]),
    "scattered": ([[7, 2, 5], [0]], [10, 1]),
    "shared prefix pages": ([[0, 1, 2], [0, 1, 3], [0, 4]], [11, 12, 6]),
    "page boundaries": ([[0, 1], [2, 3]], [8, 4]),
    "one token each": ([[0], [1], [2]], [1, 1, 1]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_dense(name):
    tables, lengths = CASES[name]
    got, want = run_case(tables, lengths)
    torch.testing.assert_close(got.float(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [1, 3, 5, 100])
def test_sliding_window(window):
    got, want = run_case([[0, 1, 2], [3, 4], [5]], [11, 7, 3], window=window)
    torch.testing.assert_close(got.float(), want, atol=1e-5, rtol=1e-5)


def test_a_window_drops_pages_it_cannot_see():
    plan = build_plan([[0, 1, 2]], [11], page_size=4, sliding_window=3)
    assert plan.num_units == 1 and plan.first_page == 2  # positions 8..10 live in the third page only
    assert plan.unit_start.tolist() == [0] and plan.unit_end.tolist() == [3]


def test_a_run_is_read_without_a_gather_and_shared_pages_are_gathered():
    assert build_plan([[0, 1], [2]], [6, 3], 4, None).gather is None
    shared = build_plan([[0, 1], [0, 2]], [6, 7], 4, None)
    assert shared.gather is not None and shared.gather.tolist() == [0, 0, 1, 2]


def test_far_apart_pages_are_gathered_rather_than_read_with_a_long_gap():
    plan = build_plan([[0], [40]], [3, 3], 4, None)
    assert plan.gather is not None and plan.num_units == 2


def test_bfloat16_is_close():
    got, want = run_case([[0, 1, 2], [3, 4]], [12, 5], page_size=4, hq=8, hkv=2, d=64, dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("seed", range(20))
def test_random_layouts(seed):
    rng = random.Random(seed)
    page_size = rng.choice([1, 2, 4, 16])
    free = list(range(40))
    rng.shuffle(free) if rng.random() < 0.5 else None
    tables, lengths = [], []
    for _ in range(rng.randint(1, 6)):
        n = rng.randint(1, 5 * page_size)
        pages = (n + page_size - 1) // page_size
        tables.append([free.pop(0) for _ in range(pages)])
        lengths.append(n)
    window = rng.choice([None, None, rng.randint(1, 3 * page_size)])
    hkv = rng.choice([1, 2])
    got, want = run_case(tables, lengths, page_size, hq=hkv * rng.choice([1, 3]), hkv=hkv, window=window, seed=seed)
    torch.testing.assert_close(got.float(), want, atol=1e-5, rtol=1e-5)


def test_the_plan_is_reused_within_a_step_and_rebuilt_when_inputs_change():
    tables = torch.tensor([[0, 1], [2, 0]])
    cache = paged_decode._PlanCache()
    first = cache.get(tables, [6, 3], 4, None)
    assert cache.get(tables, [6, 3], 4, None) is first  # the next layer of the same step
    assert cache.get(tables, [7, 3], 4, None) is not first  # the next step: lengths grew
    again = cache.get(tables, [7, 3], 4, None)
    tables[1, 0] = 3  # the scheduler edited the table in place
    moved = cache.get(tables, [7, 3], 4, None)
    assert moved is not again
    assert moved.gather is None and moved.num_units == 4  # pages 0..3 now, page 2 a gap
    assert moved.unit_seq.tolist()[3] == 1 and moved.unit_end.tolist() == [4, 3, 0, 3]
    assert cache.get(tables.clone(), [7, 3], 4, None) is moved  # a new tensor with equal values
    with torch.inference_mode():  # the generator's tensors carry no version counter
        assert cache.get(torch.tensor([[0, 1], [3, 0]]), [7, 3], 4, None) is moved
