"""Quantized KV pages (8, 6, 4 bits) in Triton: writing new rows, and paged attention that reads the pages packed.

Twins: `kernels.torch_ref.kv_quant.write_kv` (the format is defined in that module) and the torch attention,
which takes the same arguments and routes uint8 pages to its quantized path. A cache layer is uint8
[num_pages, page_size, num_kv_heads, row_bytes], each head row head_dim / 32 blocks of

    scale (float16) | 32 codes of `bits` bits

Writing: one program per (token, run of blocks of its heads), K and V together. Each block of 32 is rotated by
the same five butterfly stages as the twin, in float32, and quantized with the same operations (scale by an
exact power-of-two multiply, IEEE reciprocal, round-half-even), launched without FMA contraction, so the codes
match the twin's to the bit.

Attention: the float kernels' organization (`kernels.triton.attention`: flash-decoding over split keys, ragged
prefill tiles, the same masks and launch geometry), with three changes. Each key or value tile is dequantized
as it is loaded, from the packed bytes and each block's scale; the queries are rotated inside the kernel (the
cache holds rotated rows, and the rotation is orthogonal, so q . k is unchanged); and the output is rotated back
before it is stored. Rotation is linear, so a decode split's partial sum can be rotated before the splits are
merged, and the float kernels' merge runs unchanged. On a GPU the dequantized tiles go to the tensor cores in
q's 16-bit dtype; the twin computes in float32 throughout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernels.torch_ref.kv_quant import GROUP, bits_of
from kernels.triton import launch
from kernels.triton.attention import NEG_BIG, launch_paged

NORM = tl.constexpr(0.17677669529663687)  # 1 / sqrt(32), as the twin's
# Adding and subtracting 1.5 * 2^23 rounds a float32 of magnitude below 2^22 to the nearest integer, ties to
# even, as torch.round does; values over their scale stay within a few times 2^(bits-1) before the clamp.
ROUNDER = tl.constexpr(12582912.0)
MAX_WRITE_ROWS = 32  # blocks of 32 values per write program


@triton.jit
def _rotate(x, ROWS: tl.constexpr, COLS: tl.constexpr):
    """The normalized 32-point Hadamard transform of each block of 32 along the rows of x [ROWS, COLS] (float32).

    The twin's butterflies: at stage h, value i (bit h clear) becomes x[i] + x[i + h] and value i + h becomes
    x[i] - x[i + h]; each is one IEEE add, so the results are the twin's to the bit.
    """
    y = tl.reshape(x, (ROWS * COLS // 32, 32))
    idx = tl.broadcast_to(tl.arange(0, 32)[None, :], (ROWS * COLS // 32, 32))
    for stage in tl.static_range(5):
        partner = tl.gather(y, idx ^ (1 << stage), axis=1)
        y = tl.where((idx & (1 << stage)) != 0, partner - y, y + partner)
    return tl.reshape(y * NORM, (ROWS, COLS))


@triton.jit
def _quantize_rows(
    src_ptr, cache_ptr, token, slot_offset, blocks, b_mask, stride_t, stride_h, stride_head,
    NUM_BLOCKS: tl.constexpr, BITS: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Rotate, quantize and store blocks `blocks` (head * NUM_BLOCKS + block) of one token's rows."""
    BLOCK_BYTES: tl.constexpr = 2 + 4 * BITS
    TOP: tl.constexpr = 1 << (BITS - 1)
    head = blocks // NUM_BLOCKS
    offs = tl.arange(0, 32)
    src = src_ptr + token * stride_t + head * stride_h + (blocks % NUM_BLOCKS) * 32
    x = tl.load(src[:, None] + offs[None, :], mask=b_mask[:, None], other=0.0).to(tl.float32)
    x = _rotate(x, BLOCK_R, 32)  # [BLOCK_R, 32]

    # The scale: the block's value of largest magnitude (the first of ties, signed) over -TOP, as float16.
    # The max picks one value out of -inf, keeping the sign of a zero (an all-zero block's scale is -0.0).
    largest = tl.max(tl.abs(x), axis=1)
    first = tl.min(tl.where(tl.abs(x) == largest[:, None], offs[None, :], 32), axis=1)
    signed = tl.max(tl.where(offs[None, :] == first[:, None], x, float("-inf")), axis=1)
    scale = (signed * (-1.0 / TOP)).to(tl.float16)  # the multiply is exact: a power of two
    wide = scale.to(tl.float32)
    is_zero = wide == 0.0
    divisor = tl.where(is_zero, 1.0, wide)  # a zero scale takes inverse 0, as the twin's; no division by zero
    inverse = tl.where(is_zero, 0.0, tl.math.div_rn(tl.full([BLOCK_R], 1.0, tl.float32), divisor))  # IEEE, as torch
    rounded = (x * inverse[:, None] + ROUNDER) - ROUNDER
    codes = (tl.minimum(tl.maximum(rounded, -TOP), TOP - 1) + TOP).to(tl.int32)  # [BLOCK_R, 32] 0..2^BITS-1

    dst = cache_ptr + slot_offset + head * stride_head + (blocks % NUM_BLOCKS) * BLOCK_BYTES  # [BLOCK_R]
    halves = tl.arange(0, 2)
    bits16 = scale.to(tl.int16, bitcast=True).to(tl.int32)
    scale_bytes = (bits16[:, None] >> (8 * halves[None, :])) & 255  # little-endian, as the twin's view
    tl.store(dst[:, None] + halves[None, :], scale_bytes.to(tl.uint8), mask=b_mask[:, None])
    if BITS == 8:
        tl.store(dst[:, None] + 2 + offs[None, :], codes.to(tl.uint8), mask=b_mask[:, None])
    else:
        # Byte i holds code i (low nibble) and code i + 16 (high): the nibbles of [R, 2, 16] summed over the 2.
        low = tl.reshape(codes & 15, (BLOCK_R, 2, 16)) << (4 * halves)[None, :, None]
        offs16 = tl.arange(0, 16)
        tl.store(dst[:, None] + 2 + offs16[None, :], tl.sum(low, axis=1).to(tl.uint8), mask=b_mask[:, None])
        if BITS == 6:
            # Byte j holds the top 2 bits of codes j, j + 8, j + 16, j + 24 at bits 0, 2, 4, 6.
            quarters = tl.arange(0, 4)
            high = tl.reshape(codes >> 4, (BLOCK_R, 4, 8)) << (2 * quarters)[None, :, None]
            offs8 = tl.arange(0, 8)
            tl.store(dst[:, None] + 18 + offs8[None, :], tl.sum(high, axis=1).to(tl.uint8), mask=b_mask[:, None])


@triton.jit
def _write_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, page_size, num_rows,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_page, stride_slot, stride_head,
    NUM_BLOCKS: tl.constexpr, BITS: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    blocks = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)  # head * NUM_BLOCKS + block, over all heads
    b_mask = blocks < num_rows
    slot = tl.load(slots_ptr + token).to(tl.int64)
    slot_offset = (slot // page_size) * stride_page + (slot % page_size) * stride_slot
    _quantize_rows(
        k_ptr, k_cache_ptr, token, slot_offset, blocks, b_mask, stride_kt, stride_kh, stride_head,
        NUM_BLOCKS, BITS, BLOCK_R,
    )  # fmt: skip
    _quantize_rows(
        v_ptr, v_cache_ptr, token, slot_offset, blocks, b_mask, stride_vt, stride_vh, stride_head,
        NUM_BLOCKS, BITS, BLOCK_R,
    )  # fmt: skip


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> bool:
    """Rotate, quantize and store k, v [num_tokens, num_kv_heads, head_dim] at flat slots (page * page_size +
    offset). The caches may be strided views (unit last stride, both alike); k and v need a unit last stride."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return True
    bits = bits_of(k_cache, head_dim)
    num_rows = num_kv_heads * head_dim // GROUP
    block_r = min(MAX_WRITE_ROWS, max(4, triton.next_power_of_2(num_rows)))
    _write_kernel[(num_tokens, triton.cdiv(num_rows, block_r))](
        k, v, k_cache, v_cache, slot_mapping, k_cache.shape[1], num_rows,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_BLOCKS=head_dim // GROUP, BITS=bits, BLOCK_R=block_r,
        enable_fp_fusion=False,  # a fused multiply-add would round x * inverse differently from the twin
    )  # fmt: skip
    return True


@triton.jit
def _row_offsets(table_ptr, kv_pos, kv_mask, page_size, stride_page, stride_slot, head_offset):
    """Byte offsets of one KV head's rows at positions kv_pos of one sequence (the same in K and V)."""
    page = tl.load(table_ptr + kv_pos // page_size, mask=kv_mask, other=0).to(tl.int64)
    return page * stride_page + (kv_pos % page_size) * stride_slot + head_offset


@triton.jit
def _load_tile(cache_ptr, rows, kv_mask, offs_d, d_mask, BITS: tl.constexpr):
    """The rows at byte offsets `rows` (keys or values), dequantized: float32 [BLOCK_N, BLOCK_D]."""
    BLOCK_BYTES: tl.constexpr = 2 + 4 * BITS
    block = cache_ptr + rows[:, None] + (offs_d // 32 * BLOCK_BYTES)[None, :]  # each value's block
    i = (offs_d % 32)[None, :]  # its place in the block
    mask = kv_mask[:, None] & d_mask[None, :]
    # Blocks are an even number of bytes, so every scale is 2-byte aligned.
    scale = tl.load(block.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)
    if BITS == 8:
        codes = tl.load(block + 2 + i, mask=mask, other=0).to(tl.int32)
    else:
        codes = (tl.load(block + 2 + i % 16, mask=mask, other=0).to(tl.int32) >> (i // 16 * 4)) & 15
        if BITS == 6:
            high = tl.load(block + 18 + i % 8, mask=mask, other=0).to(tl.int32)
            codes = codes | (((high >> (i // 8 * 2)) & 3) << 4)
    return (codes - (1 << (BITS - 1))).to(tl.float32) * scale


@triton.jit
def _load_rotated(ptr, mask, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, FP32_DOT: tl.constexpr):
    """Query rows [ROWS, BLOCK_D] rotated as the cache's keys, in the dtype the dots take."""
    q = _rotate(tl.load(ptr, mask=mask, other=0.0).to(tl.float32), ROWS, BLOCK_D)
    if not FP32_DOT:
        q = q.to(ptr.dtype.element_ty)
    return q


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    qk_scale, page_size, split_len, num_splits, window,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_table, stride_ot, stride_oh,
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
    q = _load_rotated(q_tile, g_mask[:, None] & d_mask[None, :], BLOCK_G, BLOCK_D, FP32_DOT)

    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    if HAS_WINDOW:
        # The one query sits at seq_len - 1 and sees keys after seq_len - 1 - window.
        first = tl.maximum(seq_len - window, 0)
        start = tl.maximum(start, first // BLOCK_N * BLOCK_N)

    table = table_ptr + seq * stride_table
    head_offset = kv_head * stride_kh
    m_i = tl.full([BLOCK_G], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_N):
        kv_pos = block_start + tl.arange(0, BLOCK_N)
        kv_mask = kv_pos < end
        kv_rows = _row_offsets(table, kv_pos, kv_mask, page_size, stride_kp, stride_ks, head_offset)
        k = _load_tile(k_ptr, kv_rows, kv_mask, offs_d, d_mask, BITS).to(q.dtype)
        v = _load_tile(v_ptr, kv_rows, kv_mask, offs_d, d_mask, BITS).to(q.dtype)
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
        # Partial sums rotated back now: the merge is linear, so it commutes with the rotation.
        part = (seq * GROUP * tl.num_programs(1) + heads) * num_splits + split  # [seq, head, split] flattened
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], _rotate(acc, BLOCK_G, BLOCK_D),
                 mask=out_mask)  # fmt: skip
        tl.store(part_max_ptr + part, m_i, mask=g_mask)
        tl.store(part_sum_ptr + part, l_i, mask=g_mask)
    else:
        out = _rotate(acc / l_i[:, None], BLOCK_G, BLOCK_D)
        tl.store(
            out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, tiles_ptr, key_ends_ptr, out_ptr, qk_scale, page_size, window,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_table, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, BITS: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_KEY_ENDS: tl.constexpr,
    FP32_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
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
    q = _load_rotated(q_tile, m_mask[:, None] & d_mask[None, :], BLOCK_M, BLOCK_D, FP32_DOT)
    q_pos = pos0 + offs_m

    # Keys up to the tile's last query position (or its last key end); with a window, from the first row's
    # earliest key.
    if HAS_KEY_ENDS:
        key_ends = tl.load(key_ends_ptr + rows, mask=m_mask, other=0)
        end = tl.minimum(tl.max(key_ends, axis=0), kv_len)
    else:
        end = tl.minimum(pos0 + num_rows, kv_len)
    start = 0
    if HAS_WINDOW:
        start = tl.maximum(pos0 - window + 1, 0) // BLOCK_N * BLOCK_N

    table = table_ptr + seq * stride_table
    head_offset = kv_head * stride_kh
    m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_N):
        kv_pos = block_start + tl.arange(0, BLOCK_N)
        kv_mask = kv_pos < end
        kv_rows = _row_offsets(table, kv_pos, kv_mask, page_size, stride_kp, stride_ks, head_offset)
        k = _load_tile(k_ptr, kv_rows, kv_mask, offs_d, d_mask, BITS).to(q.dtype)
        v = _load_tile(v_ptr, kv_rows, kv_mask, offs_d, d_mask, BITS).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if HAS_KEY_ENDS:
            valid = kv_mask[None, :] & (kv_pos[None, :] < key_ends[:, None])
        else:
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

    # Rows past num_rows may have no key at all (l = 0); they are never stored.
    out = _rotate(acc / tl.maximum(l_i, 1e-30)[:, None], BLOCK_M, BLOCK_D)
    tl.store(
        out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


def _blocks(head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_N, num_warps): smaller key tiles and more warps than the float kernels', since dequantizing
    also holds each tile's byte addresses and codes in registers (at these sizes nothing spills on sm_90)."""
    block_d = triton.next_power_of_2(head_dim)
    return block_d, 32 if block_d <= 128 else 16, 4 if block_d <= 64 else 8


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
    key_ends: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal paged attention over quantized pages -> [num_tokens, Hq, D] in q's dtype; see the module docstring.

    With `key_ends` [num_tokens] (int64), new token t sees the keys at positions < key_ends[t] instead of up to
    its own, as `kernels.torch_ref.attention.paged_attention_key_ends`. The caches need a unit last stride and
    the same strides; q a unit last stride.
    """
    out = launch.empty(q.shape, q.dtype, q.device)
    if q.shape[0] == 0:
        return out
    args = (q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window)
    return launch_paged(
        _decode_kernel,
        _prefill_kernel,
        *args,
        out,
        _blocks(q.shape[2]),
        q.dtype,
        constants={"BITS": bits_of(k_cache, q.shape[2])},
        prefill_inputs=(key_ends,) if key_ends is not None else (block_tables,),  # a pointer the kernel ignores
        prefill_constants={"HAS_KEY_ENDS": key_ends is not None},
        may_decode=key_ends is None,
    )
