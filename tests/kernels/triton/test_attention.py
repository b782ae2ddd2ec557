"""Triton paged attention and KV writes against their torch twins (on CPU through triton's interpreter).

Every case draws fresh random inputs (seeded by the case's id, so a failure reproduces) and lays each
sequence's pages out in shuffled order; every buffer the kernels allocate starts as NaN, so an element a
kernel forgets to write fails the comparison.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from kernels.triton import launch  # does not import triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    launch.use_interpreter()  # before triton is imported: it picks the interpreter at import
pytest.importorskip("triton", reason="triton is not installed: the Triton kernels are tested only where it is")

from kernels.torch_ref import attention as twin  # noqa: E402
from kernels.triton import attention, kv_write  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Make every output and scratch buffer of the launchers start as NaN instead of whatever memory held."""
    monkeypatch.setattr(
        launch, "empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
    )


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Within `TOLERANCE[dtype]` relative to each element and to the largest magnitude (for values near 0)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    tol = TOLERANCE[dtype]
    scale = expected.float().abs().max().item()
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol * scale)


def generator(request) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(request.node.name.encode()))


def paged_case(g, seq_lens, query_lens, page_size, num_q_heads, num_kv_heads, head_dim, dtype):
    """Random cache with shuffled page tables (plus unused pages) and q as a strided view of a fused qkv."""
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_per_seq) + 2
    order = torch.randperm(num_pages, generator=g).tolist()
    tables, used = [], 0
    for n in pages_per_seq:
        tables.append(order[used : used + n])
        used += n
    width = max(pages_per_seq)
    block_tables = torch.tensor([t + [order[-1]] * (width - len(t)) for t in tables])
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    qkv = torch.randn(sum(query_lens), (num_q_heads + 2 * num_kv_heads) * head_dim, generator=g).to(dtype)
    q = qkv[:, : num_q_heads * head_dim].view(-1, num_q_heads, head_dim)
    tensors = (q, k_cache, v_cache, block_tables, torch.tensor(seq_lens))
    return tuple(t.to(DEVICE) for t in tensors) + (tuple(query_lens), tuple(seq_lens), head_dim**-0.5)


def check_attention(args, dtype, window=None) -> None:
    out = attention.paged_attention(*args, window)
    ref = twin.paged_attention(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args), window)
    assert_close(out.cpu(), ref, dtype)


# Lengths cross page boundaries (and sit exactly on them); one sequence has a single token.
SEQ_LENS = {16: [1, 16, 17, 40], 256: [1, 256, 300]}
GQA = [1, 4, 8]
HEAD_DIMS = [64, 80, 128, 256]
DTYPES = [torch.float32, torch.bfloat16]


def heads(gqa: int) -> tuple[int, int]:
    """(query heads, KV heads): one KV head at GQA 8, so that case also takes the split-keys decode path."""
    num_kv_heads = 1 if gqa == 8 else 2
    return gqa * num_kv_heads, num_kv_heads


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("gqa", GQA)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_decode_matches_twin(request, head_dim, gqa, page_size, dtype):
    seq_lens = SEQ_LENS[page_size]
    args = paged_case(generator(request), seq_lens, [1] * len(seq_lens), page_size, *heads(gqa), head_dim, dtype)
    check_attention(args, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("gqa", GQA)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_prefill_matches_twin(request, head_dim, gqa, page_size, dtype):
    # Ragged: a whole prompt, a decode row, chunks after cached pages that cross a page boundary.
    past, query_lens = {16: ([0, 16, 5], [12, 1, 30]), 256: ([0, 250], [20, 30])}[page_size]
    seq_lens = [p + n for p, n in zip(past, query_lens)]
    args = paged_case(generator(request), seq_lens, query_lens, page_size, *heads(gqa), head_dim, dtype)
    check_attention(args, dtype)


@pytest.mark.parametrize("page_size", [16, 256])
def test_decode_split_over_many_pages(request, page_size):
    """One long sequence: the keys are split over several programs and merged; pages of 16 mean many pages."""
    args = paged_case(generator(request), [700], [1], page_size, 8, 1, 128, torch.float32)
    num_splits, _ = attention._num_splits(1, 700, args[0].device, 64)
    assert num_splits > 1
    check_attention(args, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 30, 5]], ids=["decode", "prefill"])
def test_sliding_window(request, query_lens, dtype):
    seq_lens = [300, 100, 37]
    args = paged_case(generator(request), seq_lens, query_lens, 16, 4, 2, 64, dtype)
    check_attention(args, dtype, window=50)


def test_query_dtype_differs_from_cache(request):
    """The twin rounds q to the cache dtype first; so must the kernel."""
    q, *rest = paged_case(generator(request), [40, 9], [1, 1], 16, 4, 2, 64, torch.bfloat16)
    check_attention((q.float(), *rest), torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_write_kv_matches_twin(request, head_dim, page_size, dtype):
    g = generator(request)
    num_pages, num_kv_heads, num_tokens = 3, 2, 37
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    # Poisoned caches: any slot the kernel writes wrongly, or writes when it should not, differs from the twin.
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    fused = torch.randn(num_tokens, 3 * num_kv_heads * head_dim, generator=g).to(dtype)
    k = fused[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    v = fused[:, 2 * num_kv_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_pages * page_size, generator=g)[:num_tokens]
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    twin.write_kv(ref_k, ref_v, k, v, slots)
    dev = [t.to(DEVICE) for t in (k_cache, v_cache, k, v, slots)]
    assert kv_write.write_kv(*dev) is True
    torch.testing.assert_close(dev[0].cpu(), ref_k, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(dev[1].cpu(), ref_v, rtol=0, atol=0, equal_nan=True)


def test_write_kv_converts_to_the_cache_dtype(request):
    g = generator(request)
    k_cache = torch.full((2, 16, 2, 64), float("nan"), dtype=torch.bfloat16)
    v_cache = k_cache.clone()
    k, v = torch.randn(5, 2, 64, generator=g), torch.randn(5, 2, 64, generator=g)
    slots = torch.tensor([31, 0, 7, 16, 15])
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    twin.write_kv(ref_k, ref_v, k, v, slots)
    dev = [t.to(DEVICE) for t in (k_cache, v_cache, k, v, slots)]
    kv_write.write_kv(*dev)
    # A GPU rounds float32 -> bfloat16 to nearest like torch; triton 3.9's interpreter truncates (1 ulp).
    rtol = 2**-7 if launch.interpreting() else 0.0
    torch.testing.assert_close(dev[0].cpu(), ref_k, rtol=rtol, atol=0, equal_nan=True)
    torch.testing.assert_close(dev[1].cpu(), ref_v, rtol=rtol, atol=0, equal_nan=True)
