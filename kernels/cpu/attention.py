"""Paged attention on CPU tensors through the C kernels: paged_decode.c for decode steps, paged_prefill.c
for prompts.

Decode: when every sequence has at most `MAX_QUERIES` new tokens (a decode step, or the few tokens a
speculative step verifies) and the cache is float32 or bfloat16. The kernel serves one query per row: a
sequence with several new tokens becomes one row per token, each seeing the keys up to its own position,
so a verified draft token is scored by the same arithmetic as the same token decoded alone.

Prompts: longer runs of new tokens over a bfloat16 cache with head_dim a multiple of 32, on a CPU with
AVX512-BF16.

Anything else (float16, CUDA, head sizes over 256, GQA groups over 16, float32 prompts) returns None and
goes to the next backend.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from kernels.cpu import build

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_MAX_DIM, _MAX_GROUP = 256, 16
# Each row reads its sequence's keys again, so many new tokens (a prompt) are left to the prefill path.
MAX_QUERIES = 16
_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
# q, k_cache, v_cache, out, then the cache's page, slot and head strides
_CACHE_ARGS = (_ptr,) * 4 + (_i64,) * 3


def _kernel():
    # ... tables, table stride, seq_lens, rows, q heads, kv heads, head_dim, page_size, window, scale, dtype, threads
    args = (*_CACHE_ARGS, _ptr, _i64, _ptr) + (_i64,) * 6 + (_f32, ctypes.c_int, _i64)
    return build.function("paged_decode", "paged_decode_attention", args, ctypes.c_int)


def _prefill_kernel():
    # ... tables, table stride, seq_lens, query starts, query lens, sequences, q heads, kv heads, head_dim,
    # page_size, window, scale, threads
    args = (*_CACHE_ARGS, _ptr, _i64, _ptr, _ptr, _ptr) + (_i64,) * 6 + (_f32, _i64)
    return build.function("paged_prefill", "paged_prefill_attention", args, ctypes.c_int)


def _handles(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, dtypes) -> bool:
    """A CPU cache of one of `dtypes` both kernels can address: unit-stride head_dim, K and V alike."""
    num_q_heads, head_dim, num_kv_heads = q.shape[1], q.shape[2], k_cache.shape[2]
    return (
        k_cache.device.type == "cpu"
        and k_cache.dtype in dtypes
        and v_cache.dtype == k_cache.dtype
        and k_cache.stride() == v_cache.stride()
        and k_cache.stride(3) == 1
        and head_dim <= _MAX_DIM
        and num_q_heads % num_kv_heads == 0
        and num_q_heads // num_kv_heads <= _MAX_GROUP
    )


def _cache_pointers(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor) -> list:
    return [q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), *k_cache.stride()[:3]]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None = None,
    page_runs: Sequence[int] | None = None,
) -> torch.Tensor | None:
    if not query_lens or q.shape[0] != sum(query_lens) or not _handles(q, k_cache, v_cache, _DTYPES):
        return None
    if max(query_lens) > MAX_QUERIES:
        if min(query_lens) <= MAX_QUERIES:  # each sequence by its own kernel: see _split
            return _split(q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window)
        return _prefill(q, k_cache, v_cache, block_tables, query_lens, seq_lens_host, scale, sliding_window)
    fn = _kernel()
    if fn is None:
        return None
    q = q.to(k_cache.dtype).contiguous()
    tables = block_tables.to(device="cpu", dtype=torch.int64)
    if q.shape[0] == len(query_lens):
        lens = seq_lens.to(device="cpu", dtype=torch.int64).contiguous()
    else:  # one row per new token, each with its sequence's page table and its own length
        tables = tables.repeat_interleave(torch.tensor(query_lens, dtype=torch.int64), dim=0)
        ends = zip(query_lens, seq_lens_host)
        lens = torch.tensor([end - n + j + 1 for n, end in ends for j in range(n)], dtype=torch.int64)
    out = torch.empty_like(q)
    call = bind_decode(
        q, k_cache, v_cache, out, tables.contiguous(), lens, scale, sliding_window, torch.get_num_threads()
    )
    return out if call is not None and call[0](*call[1]) == 0 else None


def bind_decode(q, k_cache, v_cache, out, tables, lens, scale: float, sliding_window: int | None, threads):
    """The decode kernel and its arguments: one query row of q [rows, q heads, head_dim] (contiguous, the
    cache's dtype) per row of `tables` [rows, pages] and `lens` [rows] (int64, contiguous), into out like q;
    or None. A call returns 0 when done. Kept by kernels/cpu/plan.py to replay a decode step."""
    fn = _kernel()
    if fn is None or not _handles(q, k_cache, v_cache, _DTYPES) or q.dtype != k_cache.dtype or not q.is_contiguous():
        return None
    if not out.is_contiguous() or tables.stride(1) != 1 or not lens.is_contiguous() or tables.dtype != torch.int64:
        return None
    sizes = (q.shape[0], q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], sliding_window or 0)
    args = (*_cache_pointers(q, k_cache, v_cache, out), tables.data_ptr(), tables.stride(0), lens.data_ptr())
    return fn, (*args, *sizes, scale, _DTYPES[k_cache.dtype], threads)


def _split(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor | None:
    """A batch mixing prompt chunks with decode tokens: the decode kernel for the sequences with few new tokens,
    the prefill kernel for the rest, so a sequence's attention never depends on what else shares its forward
    (a greedy job gives the same tokens alone and in any batch)."""
    out = torch.empty(q.shape, dtype=k_cache.dtype)
    starts = [sum(query_lens[:i]) for i in range(len(query_lens))]
    for few in (True, False):
        picked = [i for i, n in enumerate(query_lens) if (n <= MAX_QUERIES) == few]
        rows = torch.cat([torch.arange(starts[i], starts[i] + query_lens[i]) for i in picked])
        part = paged_attention(
            q[rows],
            k_cache,
            v_cache,
            block_tables[picked],
            seq_lens[picked],
            [query_lens[i] for i in picked],
            [seq_lens_host[i] for i in picked],
            scale,
            sliding_window,
        )
        if part is None:
            return None
        out[rows] = part
    return out


def _prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor | None:
    if k_cache.dtype != torch.bfloat16 or q.shape[2] % 32:  # the rest was checked by paged_attention
        return None
    fn = _prefill_kernel()
    if fn is None:
        return None
    q = q.to(k_cache.dtype).contiguous()
    tables = block_tables.to(device="cpu", dtype=torch.int64).contiguous()
    lens = torch.tensor(list(seq_lens_host), dtype=torch.int64)
    counts = torch.tensor(list(query_lens), dtype=torch.int64)
    starts = torch.cumsum(counts, 0) - counts
    out = torch.empty_like(q)
    sizes = [len(query_lens), q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], sliding_window or 0]
    status = fn(
        *_cache_pointers(q, k_cache, v_cache, out),
        tables.data_ptr(),
        tables.stride(0),
        lens.data_ptr(),
        starts.data_ptr(),
        counts.data_ptr(),
        *sizes,
        scale,
        torch.get_num_threads(),
    )
    return out if status == 0 else None
