"""Quantized KV pages (8, 6 and 4 bits; format in kernels/torch_ref/kv_quant.py) on CPU tensors through C: new
keys and values rotated and quantized into their slots by kv_quant.c, attention by paged_decode.c (decode
steps) and paged_prefill_quant.c (prompts).

A decode step (one new token per sequence) takes paged_decode_quant, which dequantizes each block of keys and
values into a float32 scratch as it goes and runs the float32 kernel's block loops on it, with the query
rotated in and the output rotated back; so a step reads the quantized bytes, at 4 bits about a quarter of a
bfloat16 cache's. A call with a prompt in it (a sequence with more than one new token) takes
paged_prefill_quant, which runs each sequence's rows in tiles of 16 consecutive tokens: each block of keys and
values a tile reads is dequantized once, not once per row (a block costs about as much to dequantize as a
row's multiply-adds over it), and every row of the tile runs the decode kernel's own row functions
(paged_rows.h) on it, with its own online softmax, while the block sits in L1.

Both give a row the same bits: a prompt's row goes over the same blocks as the decode step for its token (the
same first key, block size and cut at its length), through the same functions, and dequantized values are
exact floats however computed. So a token gets the same answer from a cold prompt, from the one token
recomputed after a prefix-cache hit, and from a decode step (see kernels/cpu/attention.py's docstring for why
that matters); and each equals the float32 kernel on the dequantized pages with the rotated query, its output
rotated back.

`paged_attention_sinks` is the same with a learned sink logit per query head (gpt-oss), taken by every row of
both kernels as its first key, one with no value (paged_rows.h's softmax_start), so the bits still match.

Each candidate returns None for what it does not handle (CUDA, float caches, head sizes that are not a
multiple of 32 or over 256, GQA groups over 16, q not float32 or bfloat16, a prompt whose page table points
outside the cache), which goes on to the next backend.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import torch

from kernels.cpu import build
from kernels.cpu.attention import bindable_sinks, sink_logits, sink_pointer
from kernels.torch_ref import kv_quant as twin

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_MAX_DIM, _MAX_GROUP = 256, 16
_i64, _ptr, _f32, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int


def _write_kernel():
    # k, its row and head strides, v, its strides, dtype, k_cache, v_cache, their page, slot and head strides,
    # slots, num_pages, page_size, rows, heads, head_dim, bits, threads
    args = (_ptr, _i64, _i64, _ptr, _i64, _i64, _int, _ptr, _ptr, _i64, _i64, _i64, _ptr) + (_i64,) * 5 + (_int, _i64)
    return build.function("kv_quant", "kv_quant_write", args, ctypes.c_int)


def _decode_kernel():
    # q, k_cache, v_cache, out, cache strides, tables, table stride, seq_lens, rows, q heads, kv heads, head_dim,
    # page_size, window, scale, sinks, dtype, bits, threads
    args = (_ptr,) * 4 + (_i64,) * 3 + (_ptr, _i64, _ptr) + (_i64,) * 6 + (_f32, _ptr, _int, _int, _i64)
    return build.function("paged_decode", "paged_decode_quant", args, ctypes.c_int)


def _prefill_kernel():
    # q, k_cache, v_cache, out, cache strides, tables, table stride, seq_lens, query starts, query lens,
    # sequences, num_pages, q heads, kv heads, head_dim, page_size, window, scale, sinks, dtype, bits, threads
    args = (_ptr,) * 4 + (_i64,) * 3 + (_ptr, _i64, _ptr, _ptr, _ptr) + (_i64,) * 7 + (_f32, _ptr, _int, _int, _i64)
    return build.function("paged_prefill_quant", "paged_prefill_quant", args, ctypes.c_int)


def _bits(k_cache: torch.Tensor, v_cache: torch.Tensor, head_dim: int) -> int | None:
    """The caches' bits where the kernels can address them (CPU uint8 pages of whole rows, unit-stride bytes, K
    and V alike), else None."""
    if k_cache.device.type != "cpu" or k_cache.dim() != 4 or head_dim > _MAX_DIM:
        return None
    if v_cache.dtype != k_cache.dtype or v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        return None
    try:
        bits = twin.bits_of(k_cache, head_dim)
    except ValueError:  # a uint8 row of no format: the twin says so
        return None
    if bits is None or k_cache.shape[3] != twin.row_bytes(head_dim, bits) or k_cache.stride(3) != 1:
        return None
    return bits


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> bool | None:
    """Rotate, quantize and store new K/V rows [tokens, heads, head_dim] at flat slots (as the twin's write_kv)."""
    slots = slot_mapping.to(device="cpu", dtype=torch.int64).contiguous()
    call = bind_write(k, v, k_cache, v_cache, slots, torch.get_num_threads())
    return True if call is not None and call[0](*call[1]) == 0 else None


def bind_write(k, v, k_cache, v_cache, slots, threads) -> tuple[Callable, tuple] | None:
    """The write kernel and its arguments, or None: k and v [rows, heads, head_dim] (float32 or bfloat16, each
    head's row contiguous, any row and head strides) into quantized caches at slots (int64 [rows],
    contiguous). The call returns -1, writing nothing, for a slot outside the cache. Kept by
    engine/models/decode_plan.py to replay a decode step."""
    if k.dim() != 3 or v.shape != k.shape or v.dtype != k.dtype or k.dtype not in _DTYPES:
        return None
    rows, heads, head_dim = k.shape
    bits = _bits(k_cache, v_cache, head_dim)
    if bits is None or k_cache.shape[2] != heads or k.stride(2) != 1 or v.stride(2) != 1:
        return None
    if k.device.type != "cpu" or v.device.type != "cpu":
        return None
    if slots.dtype != torch.int64 or slots.shape != (rows,) or not slots.is_contiguous():
        return None
    fn = _write_kernel()
    if fn is None:
        return None
    return fn, (
        k.data_ptr(),
        k.stride(0),
        k.stride(1),
        v.data_ptr(),
        v.stride(0),
        v.stride(1),
        _DTYPES[k.dtype],
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        *k_cache.stride()[:3],
        slots.data_ptr(),
        k_cache.shape[0],
        k_cache.shape[1],
        rows,
        heads,
        head_dim,
        bits,
        threads,
    )


def _handles(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> int | None:
    """The caches' bits where the attention kernels take q over them, else None."""
    if q.dim() != 3 or q.dtype not in _DTYPES or q.device.type != "cpu":
        return None
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    bits = _bits(k_cache, v_cache, head_dim)
    num_kv_heads = k_cache.shape[2]
    if bits is None or num_q_heads % num_kv_heads or num_q_heads // num_kv_heads > _MAX_GROUP:
        return None
    return bits


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
    """Causal attention over quantized pages -> [num_tokens, Hq, D] in q's dtype (as the twin's)."""
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
    bits = _handles(q, k_cache, v_cache)
    if not query_lens or q.shape[0] != sum(query_lens) or bits is None:
        return None
    tables = block_tables.to(device="cpu", dtype=torch.int64).contiguous()
    if q.shape[0] != len(query_lens):
        args = (q, k_cache, v_cache, bits, tables, query_lens, seq_lens_host, scale, sliding_window, sinks)
        return _prompt(*args)
    q = q.contiguous()
    out = torch.empty_like(q)
    lens = seq_lens.to(device="cpu", dtype=torch.int64).contiguous()
    threads = torch.get_num_threads()
    call = bind_decode(q, k_cache, v_cache, out, tables, lens, scale, sliding_window, threads, sinks)
    return out if call is not None and call[0](*call[1]) == 0 else None


def bind_decode(q, k_cache, v_cache, out, tables, lens, scale: float, sliding_window: int | None, threads, sinks=None):
    """The decode kernel and its arguments, or None: one query row of q [rows, q heads, head_dim] (float32 or
    bfloat16, contiguous) per row of `tables` [rows, pages] and `lens` [rows] (int64, unit-stride rows), into
    out like q. `sinks`: None, or float32 [q heads] (contiguous), each head's sink logit, which the caller keeps
    alive while it makes calls. A call returns 0 when done. Kept by engine/models/decode_plan.py to replay a
    decode step."""
    bits = _handles(q, k_cache, v_cache)
    if bits is None or not q.is_contiguous() or not out.is_contiguous() or out.dtype != q.dtype:
        return None
    if out.shape != q.shape or tables.dtype != torch.int64 or tables.stride(1) != 1 or not lens.is_contiguous():
        return None
    if lens.dtype != torch.int64 or tables.shape[0] != q.shape[0] or lens.shape != (q.shape[0],):
        return None
    if sinks is not None and not bindable_sinks(sinks, q.shape[1]):
        return None
    fn = _decode_kernel()
    if fn is None:
        return None
    pointers = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), *k_cache.stride()[:3])
    sizes = (q.shape[0], q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], sliding_window or 0)
    args = (*pointers, tables.data_ptr(), tables.stride(0), lens.data_ptr(), *sizes, scale, sink_pointer(sinks))
    return fn, (*args, _DTYPES[q.dtype], bits, threads)


def _prompt(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    bits: int,
    tables: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor | None:
    """paged_prefill_quant over the sequences' new tokens (their query rows one after another in q)."""
    fn = _prefill_kernel()
    if fn is None or tables.shape[0] < len(query_lens) or tables.shape[1] * k_cache.shape[1] < max(seq_lens_host):
        return None  # a table too short for its sequence: the twin raises the error
    q = q.contiguous()
    out = torch.empty_like(q)
    lens = torch.tensor(list(seq_lens_host), dtype=torch.int64)
    counts = torch.tensor(list(query_lens), dtype=torch.int64)
    starts = torch.cumsum(counts, 0) - counts
    pointers = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), *k_cache.stride()[:3])
    rows = (lens.data_ptr(), starts.data_ptr(), counts.data_ptr(), len(query_lens), k_cache.shape[0])
    sizes = (q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], sliding_window or 0)
    args = (*pointers, tables.data_ptr(), tables.stride(0), *rows, *sizes, scale, sink_pointer(sinks))
    return out if fn(*args, _DTYPES[q.dtype], bits, torch.get_num_threads()) == 0 else None
