"""Paged attention on CPU tensors through the C kernels: paged_prefill.c for bfloat16 caches, paged_decode.c
for the rest.

One arithmetic per query row, whatever else is in the call. A bfloat16 cache with head_dim a multiple of 32
on a CPU with AVX512-BF16 takes paged_prefill.c for every call: prompts, decode steps and verified drafts.
Its rows are computed independently (the same key blocks, the same dot-product chains), so a token's
attention is the same bits whether it is the last of a 1,000-token prompt, a prompt's last chunk of 3
tokens, the one token recomputed after a prefix-cache hit, or a decode step. (With the decode kernel for
short calls, a prompt's last token was computed one way cold and another way on a cache hit, and the two
round differently: greedy answers changed when a prompt was cached.)

Otherwise (float32 caches, other head sizes, CPUs without AVX512-BF16, which is most laptops) the decode
kernel serves every call, prompts included: one query per row, a sequence with several new tokens as one
row per token, each seeing the keys up to its own position. Prompts once went to the torch twin when they
had more than 16 new tokens, and the twin rounds differently: on an AVX2 CPU a job's greedy tokens then
changed with the jobs beside it (a batch with one long prompt sent every sequence to the twin) and with a
prefix-cache hit (the cached prompt's last token came from the decode kernel), and the 8-bit block kernels
turn such a rounding difference into a different token within a few steps.

Anything else (float16, CUDA, head sizes over 256, GQA groups over 16) returns None and goes to the next
backend.

`paged_attention_sinks` is the same kernels with a learned sink logit per query head (gpt-oss): the C rows take
the sink as their first key, one with no value (paged_rows.h's softmax_start), in every path alike, so each
property above holds with sinks too.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch

from kernels.cpu import build

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_MAX_DIM, _MAX_GROUP = 256, 16
_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
# q, k_cache, v_cache, out, then the cache's page, slot and head strides
_CACHE_ARGS = (_ptr,) * 4 + (_i64,) * 3


def _kernel():
    # ... tables, table stride, seq_lens, rows, q heads, kv heads, head_dim, page_size, window, scale, sinks, dtype,
    # threads
    args = (*_CACHE_ARGS, _ptr, _i64, _ptr) + (_i64,) * 6 + (_f32, _ptr, ctypes.c_int, _i64)
    return build.function("paged_decode", "paged_decode_attention", args, ctypes.c_int)


def _prefill_kernel():
    # ... tables, table stride, seq_lens, query starts, query lens, sequences, q heads, kv heads, head_dim,
    # page_size, window, scale, sinks, threads
    args = (*_CACHE_ARGS, _ptr, _i64, _ptr, _ptr, _ptr) + (_i64,) * 6 + (_f32, _ptr, _i64)
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


def sink_logits(sinks: torch.Tensor, num_q_heads: int) -> torch.Tensor | None:
    """Sinks as the C kernels read them (float32 [num_q_heads], contiguous, on the CPU), or None where they are not
    one CPU value per query head (the twin then says what is wrong)."""
    if sinks.device.type != "cpu" or sinks.shape != (num_q_heads,) or not sinks.is_floating_point():
        return None
    return sinks.to(torch.float32).contiguous()


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
    return _attention(q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window)


def paged_attention_sinks(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sinks: torch.Tensor,
    sliding_window: int | None = None,
    page_runs: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """`paged_attention` with a learned sink logit per query head (the twin's `paged_attention_sinks`)."""
    logits = sink_logits(sinks, q.shape[1]) if q.dim() == 3 else None
    if logits is None:
        return None
    args = (q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window)
    return _attention(*args, sinks=logits)


def _attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | None:
    if not query_lens or q.shape[0] != sum(query_lens) or not _handles(q, k_cache, v_cache, _DTYPES):
        return None
    if _prefill_serves(q, k_cache):
        return _prefill(q, k_cache, v_cache, block_tables, query_lens, seq_lens_host, scale, sliding_window, sinks)
    if _kernel() is None:
        return None
    q = q.to(k_cache.dtype).contiguous()
    tables = block_tables.to(device="cpu", dtype=torch.int64).contiguous()
    out = torch.empty_like(q)
    if q.shape[0] == len(query_lens):  # one new token per sequence: one call
        lens = seq_lens.to(device="cpu", dtype=torch.int64).contiguous()
        return out if _decode(q, k_cache, v_cache, out, tables, lens, scale, sliding_window, sinks) else None
    # One row per new token, each with its own length and its sequence's page table, a view repeated with
    # stride 0: a copy per token would take a 32k-token prompt's table 32k times.
    start = 0
    for i, (n, end) in enumerate(zip(query_lens, seq_lens_host)):
        rows, start = slice(start, start + n), start + n
        lens = torch.arange(end - n + 1, end + 1, dtype=torch.int64)
        table = tables[i : i + 1].expand(n, -1)
        if not _decode(q[rows], k_cache, v_cache, out[rows], table, lens, scale, sliding_window, sinks):
            return None
    return out


def _decode(q, k_cache, v_cache, out, tables, lens, scale: float, sliding_window: int | None, sinks) -> bool:
    threads = torch.get_num_threads()
    call = bind_decode(q, k_cache, v_cache, out, tables, lens, scale, sliding_window, threads, sinks)
    return call is not None and call[0](*call[1]) == 0


def bind_decode(q, k_cache, v_cache, out, tables, lens, scale: float, sliding_window: int | None, threads, sinks=None):
    """The decode kernel and its arguments: one query row of q [rows, q heads, head_dim] (contiguous, the
    cache's dtype) per row of `tables` [rows, pages] and `lens` [rows] (int64, contiguous), into out like q;
    or None. `sinks`: None, or float32 [q heads] (contiguous; `sink_logits`), each head's sink logit, which the
    caller keeps alive while it makes calls. A call returns 0 when done. Kept by kernels/cpu/plan.py to replay a
    decode step. Where paged_attention takes the prefill kernel, so does this (each row a sequence of one new
    token)."""
    if not _handles(q, k_cache, v_cache, _DTYPES) or q.dtype != k_cache.dtype or not q.is_contiguous():
        return None
    if not out.is_contiguous() or tables.stride(1) != 1 or not lens.is_contiguous() or tables.dtype != torch.int64:
        return None
    if sinks is not None and not bindable_sinks(sinks, q.shape[1]):
        return None
    if _prefill_serves(q, k_cache):
        return _bind_prefill_rows(q, k_cache, v_cache, out, tables, lens, scale, sliding_window, threads, sinks)
    fn = _kernel()
    if fn is None:
        return None
    sizes = (q.shape[0], q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], sliding_window or 0)
    args = (*_cache_pointers(q, k_cache, v_cache, out), tables.data_ptr(), tables.stride(0), lens.data_ptr())
    return fn, (*args, *sizes, scale, sink_pointer(sinks), _DTYPES[k_cache.dtype], threads)


def bindable_sinks(sinks: torch.Tensor, num_q_heads: int) -> bool:
    """Whether a bound call can read `sinks` as they are: float32 [num_q_heads], contiguous, on the CPU."""
    return (
        sinks.device.type == "cpu"
        and sinks.dtype == torch.float32
        and sinks.shape == (num_q_heads,)
        and sinks.is_contiguous()
    )


def sink_pointer(sinks: torch.Tensor | None) -> int | None:
    """The sinks' address, or None (NULL: no sinks)."""
    return None if sinks is None else sinks.data_ptr()


def _prefill_serves(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the prefill kernel takes this call: a bfloat16 cache, head_dim a multiple of 32, and a build
    with AVX512-BF16 (the kernel returns -1 without it; _prefill_kernel is None without a compiler)."""
    return k_cache.dtype == torch.bfloat16 and q.shape[2] % 32 == 0 and _prefill_built()


@functools.cache
def _prefill_built() -> bool:
    """Whether this CPU's build of paged_prefill.c computes (probed once with an empty call)."""
    fn = _prefill_kernel()
    if fn is None:
        return False
    none = torch.zeros(1, dtype=torch.int64)
    # no sequences: returns 0 at once when the kernel is compiled in, -1 when this build lacks AVX512-BF16
    return (
        fn(
            *(0,) * 4,
            1,
            1,
            1,
            none.data_ptr(),
            1,
            none.data_ptr(),
            none.data_ptr(),
            none.data_ptr(),
            0,
            1,
            1,
            32,
            1,
            0,
            1.0,
            None,
            1,
        )
        == 0
    )


@functools.cache
def _row_sequences(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query starts 0..rows-1 and lengths of 1: `rows` one-token sequences. Kept for good (a few bytes per
    row count), since decode plans bind their addresses."""
    return torch.arange(rows, dtype=torch.int64), torch.ones(rows, dtype=torch.int64)


def _bind_prefill_rows(q, k_cache, v_cache, out, tables, lens, scale, sliding_window, threads, sinks):
    fn = _prefill_kernel()
    if fn is None:
        return None
    starts, counts = _row_sequences(q.shape[0])
    sizes = (q.shape[0], q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], sliding_window or 0)
    args = (*_cache_pointers(q, k_cache, v_cache, out), tables.data_ptr(), tables.stride(0), lens.data_ptr())
    return fn, (*args, starts.data_ptr(), counts.data_ptr(), *sizes, scale, sink_pointer(sinks), threads)


def _prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor | None:
    if k_cache.dtype != torch.bfloat16 or q.shape[2] % 32:  # the rest was checked by _attention
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
        sink_pointer(sinks),
        torch.get_num_threads(),
    )
    return out if status == 0 else None
