"""Paged attention with a learned sink logit per query head (gpt-oss) in Triton, over float or quantized pages.

Twin: `kernels.torch_ref.attention.paged_attention_sinks`. A sink is one more logit in each row's softmax, a key
every query sees that has no value:

    out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m)),  m = max(max_j s_j, sink_h)

The kernels are `kernels.triton.attention`'s (float pages) and `kv_quant.py`'s (quantized pages: tiles
dequantized as they load, the query rotated in and the output rotated back), one kernel for both with BITS = 0
for float pages, and one change: a row's online softmax starts with the sink as its first key, running max =
sink, running sum = 2^(sink - sink) = 1, accumulator 0 (base 2, as the scores). The keys are then folded in as
ever, so a sink far above or below the scores needs no care of its own (their weights, or the sink's, go to 0).
A decode step split along the keys starts only split 0 with the sink; `attention._combine_splits` merges the
splits' maxima and sums unchanged and so counts it once, as it counts each split's keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernels.torch_ref.kv_quant import bits_of
from kernels.triton import launch
from kernels.triton.attention import LOG2E, NEG_BIG, _load_kv_tile, launch_paged
from kernels.triton.attention import _blocks as float_blocks
from kernels.triton.kv_quant import _blocks as quant_blocks
from kernels.triton.kv_quant import _load_rotated, _load_tile, _rotate, _row_offsets

SINK_SCALE = tl.constexpr(LOG2E)  # sinks are natural-log logits; the kernels' scores are in base 2


@triton.jit
def _load_queries(q_tile, mask, cache_ty, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BITS: tl.constexpr,
                  FP32_DOT: tl.constexpr):  # fmt: skip
    """Query rows [ROWS, BLOCK_D] in the dtype the dots take: rounded to the cache's dtype as the twin does (float
    pages), or rotated as the cache's keys (quantized pages)."""
    if BITS == 0:
        q = tl.load(q_tile, mask=mask, other=0.0).to(cache_ty)
        if FP32_DOT:
            q = q.to(tl.float32)
    else:
        q = _load_rotated(q_tile, mask, ROWS, BLOCK_D, FP32_DOT)
    return q


@triton.jit
def _load_keys_values(k_ptr, v_ptr, table, kv_pos, kv_mask, offs_d, d_mask, page_size, stride_kp, stride_ks,
                      head_offset, BITS: tl.constexpr):  # fmt: skip
    """One block of keys and values [BLOCK_N, BLOCK_D]: as stored (float pages) or dequantized (float32)."""
    if BITS == 0:
        k = _load_kv_tile(k_ptr, table, kv_pos, kv_mask, offs_d, d_mask, page_size, stride_kp, stride_ks, head_offset)
        v = _load_kv_tile(v_ptr, table, kv_pos, kv_mask, offs_d, d_mask, page_size, stride_kp, stride_ks, head_offset)
    else:
        rows = _row_offsets(table, kv_pos, kv_mask, page_size, stride_kp, stride_ks, head_offset)
        k = _load_tile(k_ptr, rows, kv_mask, offs_d, d_mask, BITS)
        v = _load_tile(v_ptr, rows, kv_mask, offs_d, d_mask, BITS)
    return k, v


@triton.jit
def _finish(x, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BITS: tl.constexpr):
    """Rows of output (or a split's partial sums) in the query's basis: quantized pages' rotated back."""
    if BITS != 0:
        x = _rotate(x, ROWS, BLOCK_D)
    return x


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    qk_scale, page_size, split_len, num_splits, window,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_table, stride_ot, stride_oh,
    sinks_ptr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, BITS: tl.constexpr, HAS_WINDOW: tl.constexpr, SPLIT: tl.constexpr,
    FP32_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g
    q_tile = q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q_mask = g_mask[:, None] & d_mask[None, :]
    q = _load_queries(q_tile, q_mask, k_ptr.dtype.element_ty, BLOCK_G, BLOCK_D, BITS, FP32_DOT)

    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    if HAS_WINDOW:
        # The one query sits at seq_len - 1 and sees keys after seq_len - 1 - window.
        first = tl.maximum(seq_len - window, 0)
        start = tl.maximum(start, first // BLOCK_N * BLOCK_N)

    table = table_ptr + seq * stride_table
    head_offset = kv_head * stride_kh
    # The sink as the first key of split 0's rows (a sink of -inf, and the other splits, start empty).
    sink = tl.load(sinks_ptr + heads, mask=g_mask, other=float("-inf")) * SINK_SCALE
    sink = tl.where(split == 0, sink, float("-inf"))
    m_i = tl.maximum(sink, NEG_BIG)
    l_i = tl.exp2(sink - m_i)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_N):
        kv_pos = block_start + tl.arange(0, BLOCK_N)
        kv_mask = kv_pos < end
        k, v = _load_keys_values(
            k_ptr, v_ptr, table, kv_pos, kv_mask, offs_d, d_mask, page_size, stride_kp, stride_ks, head_offset, BITS
        )
        k = k.to(q.dtype)
        v = v.to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_G, BLOCK_N]
        valid = kv_mask
        if HAS_WINDOW:
            valid = valid & (kv_pos >= seq_len - window)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        # Partial sums rotated back now (quantized pages): the merge is linear, so it commutes with the rotation.
        part = (seq * GROUP * tl.num_programs(1) + heads) * num_splits + split  # [seq, head, split] flattened
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], _finish(acc, BLOCK_G, BLOCK_D, BITS),
                 mask=out_mask)  # fmt: skip
        tl.store(part_max_ptr + part, m_i, mask=g_mask)
        tl.store(part_sum_ptr + part, l_i, mask=g_mask)
    else:
        out = _finish(acc / l_i[:, None], BLOCK_G, BLOCK_D, BITS)
        tl.store(
            out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, tiles_ptr, out_ptr, qk_scale, page_size, window,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_table, stride_ot, stride_oh,
    sinks_ptr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, BITS: tl.constexpr, HAS_WINDOW: tl.constexpr, FP32_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    # One tile: (sequence, first token row, rows in use, position of the first row, keys in the sequence).
    seq = tl.load(tiles_ptr + tile * 5).to(tl.int64)
    row0 = tl.load(tiles_ptr + tile * 5 + 1).to(tl.int64)
    num_rows = tl.load(tiles_ptr + tile * 5 + 2)
    pos0 = tl.load(tiles_ptr + tile * 5 + 3)
    kv_len = tl.load(tiles_ptr + tile * 5 + 4)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < num_rows
    d_mask = offs_d < HEAD_DIM
    rows = row0 + offs_m
    q_tile = q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = _load_queries(q_tile, m_mask[:, None] & d_mask[None, :], k_ptr.dtype.element_ty, BLOCK_M, BLOCK_D, BITS,
                      FP32_DOT)  # fmt: skip
    q_pos = pos0 + offs_m

    # Keys up to the tile's last query position; with a window, from the first row's earliest key.
    end = tl.minimum(pos0 + num_rows, kv_len)
    start = 0
    if HAS_WINDOW:
        start = tl.maximum(pos0 - window + 1, 0) // BLOCK_N * BLOCK_N

    table = table_ptr + seq * stride_table
    head_offset = kv_head * stride_kh
    sink = tl.load(sinks_ptr + head) * SINK_SCALE  # every row's first key
    m_i = tl.maximum(tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32), sink)
    l_i = tl.exp2(sink - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_N):
        kv_pos = block_start + tl.arange(0, BLOCK_N)
        kv_mask = kv_pos < end
        k, v = _load_keys_values(
            k_ptr, v_ptr, table, kv_pos, kv_mask, offs_d, d_mask, page_size, stride_kp, stride_ks, head_offset, BITS
        )
        k = k.to(q.dtype)
        v = v.to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        valid = kv_mask[None, :] & (kv_pos[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            valid = valid & (kv_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    # Rows past num_rows (never stored), and rows whose sink is -inf, may have nothing at all (l = 0).
    out = _finish(acc / tl.maximum(l_i, 1e-30)[:, None], BLOCK_M, BLOCK_D, BITS)
    tl.store(
        out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


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
) -> torch.Tensor:
    """Causal paged attention with sinks [Hq] (float32, contiguous, on q's device) -> [num_tokens, Hq, D]: in the
    cache's dtype over float pages, in q's over quantized (uint8) pages, as the twin. The caches need a unit last
    stride and the same strides (float caches contiguous heads), q a unit last stride."""
    head_dim = q.shape[2]
    bits = bits_of(k_cache, head_dim) if k_cache.dtype == torch.uint8 else 0
    dtype = q.dtype if bits else k_cache.dtype  # of the output, and of the tiles the dots take
    out = launch.empty(q.shape, dtype, q.device)
    if q.shape[0] == 0:
        return out
    args = (q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window)
    blocks = quant_blocks(head_dim) if bits else float_blocks(head_dim)
    # sinks_ptr goes to both kernels by name, with the BITS constant
    return launch_paged(
        _decode_kernel, _prefill_kernel, *args, out, blocks, dtype, constants={"BITS": bits, "sinks_ptr": sinks}
    )
