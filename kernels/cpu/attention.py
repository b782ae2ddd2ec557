"""Paged attention on CPU tensors through the C kernels: paged_decode.c for decode steps, paged_prefill.c
for prompts.

It takes the `paged_attention` op when every sequence has at most `MAX_QUERIES` new tokens (a decode step,
or the few tokens a speculative step verifies) and the cache is float32 or bfloat16 on the CPU; anything
else (prompts, float16, CUDA, head sizes over 256, GQA groups over 16) returns None and goes to the next
backend, except that a bfloat16 cache with head_dim a multiple of 32 sends longer prompts to the prefill
kernel (AVX512-BF16 only). The decode kernel serves one query per row: a sequence with several new tokens becomes one row per token,
each seeing the keys up to its own position. So a verified draft token is scored by the same arithmetic as
the same token decoded alone, and greedy speculation gives plain decoding's text.
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
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


def _prefill_kernel():
    library = build.load("paged_prefill")
    if library is None:
        return None
    fn = library.paged_prefill_attention
    if fn.argtypes is None:
        fn.argtypes = [_ptr] * 4 + [_i64] * 3 + [_ptr, _i64, _ptr, _ptr, _ptr] + [_i64] * 6 + [ctypes.c_float, _i64]
        fn.restype = ctypes.c_int
    return fn


def _kernel():
    library = build.load("paged_decode")
    if library is None:
        return None
    fn = library.paged_decode_attention
    if fn.argtypes is None:
        fn.argtypes = [_ptr] * 4 + [_i64] * 3 + [_ptr, _i64, _ptr] + [_i64] * 6 + [ctypes.c_float, ctypes.c_int, _i64]
        fn.restype = ctypes.c_int
    return fn


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
    if k_cache.device.type != "cpu" or k_cache.dtype not in _DTYPES or v_cache.dtype != k_cache.dtype:
        return None
    if not query_lens or q.shape[0] != sum(query_lens):
        return None
    if max(query_lens) > MAX_QUERIES:
        return _prefill(q, k_cache, v_cache, block_tables, query_lens, seq_lens_host, scale, sliding_window)
    num_rows, num_q_heads, head_dim = q.shape
    num_kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    if head_dim > _MAX_DIM or num_q_heads % num_kv_heads or num_q_heads // num_kv_heads > _MAX_GROUP:
        return None
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        return None
    fn = _kernel()
    if fn is None:
        return None
    q = q.to(k_cache.dtype).contiguous()
    tables = block_tables.to(device="cpu", dtype=torch.int64)
    if num_rows == len(query_lens):
        lens = seq_lens.to(device="cpu", dtype=torch.int64).contiguous()
    else:  # one row per new token, each with its sequence's page table and its own length
        counts = torch.tensor(query_lens, dtype=torch.int64)
        tables = tables.repeat_interleave(counts, dim=0)
        lens = torch.tensor(
            [end - n + j + 1 for n, end in zip(query_lens, seq_lens_host) for j in range(n)], dtype=torch.int64
        )
    tables = tables.contiguous()
    out = torch.empty_like(q)
    status = fn(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        out.data_ptr(),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        tables.data_ptr(),
        tables.stride(0),
        lens.data_ptr(),
        num_rows,
        num_q_heads,
        num_kv_heads,
        head_dim,
        page_size,
        sliding_window or 0,
        scale,
        _DTYPES[k_cache.dtype],
        torch.get_num_threads(),
    )
    return out if status == 0 else None


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
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    if k_cache.dtype != torch.bfloat16 or head_dim % 32 or head_dim > _MAX_DIM:
        return None
    if num_q_heads % num_kv_heads or num_q_heads // num_kv_heads > _MAX_GROUP:
        return None
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
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
    status = fn(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        out.data_ptr(),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        tables.data_ptr(),
        tables.stride(0),
        lens.data_ptr(),
        starts.data_ptr(),
        counts.data_ptr(),
        len(query_lens),
        num_q_heads,
        num_kv_heads,
        head_dim,
        page_size,
        sliding_window or 0,
        scale,
        torch.get_num_threads(),
    )
    return out if status == 0 else None
