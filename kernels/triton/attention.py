"""Paged attention in Triton: one kernel for decode (one query per sequence), one for ragged prefill.

Same signature and meaning as `kernels.torch_ref.attention.paged_attention` (cache layout described there).
Both kernels read keys and values straight from the pages: a key at position p of sequence s sits at

    page  = block_tables[s, p // page_size]
    k_cache[page, p % page_size, kv_head, :]

so any page size works and no gathered copy of a sequence is ever made.

Decode (flash-decoding): one program per (sequence, KV head, split of the keys). All query heads that share
the KV head are rows of one tile, so each key is read once per group. With several splits each program
writes an unnormalized partial result plus its running max and sum, and `_combine_splits` merges them;
splitting keeps the GPU busy at batch 1, where sequences x KV heads alone is far fewer programs than SMs.

Prefill: one program per (tile of up to BLOCK_M new tokens of one sequence, query head). The host lays out
the tiles from the host-side lengths, so the kernel needs no prefix sums. Causal masking is by position:
the new tokens of a sequence are its last query_lens[i] positions, so chunked prefill attends to every
cached page before the chunk as well as causally within it.

Scores are kept in base 2 (scaled by log2(e)) so the softmax uses exp2.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch
import triton
import triton.language as tl

from kernels.triton import launch

LOG2E = 1.4426950408889634
# Running-max start: finite, so a fully masked tile gives exp2(-inf) = 0, never NaN. A constexpr, as compiled
# kernels may read no other global (the interpreter lets them).
NEG_BIG = tl.constexpr(-1.0e30)
MIN_SPLIT_TOKENS = 128  # fewer keys per split than this and merging costs more than it spreads
INTERPRETER_PROGRAMS = 8  # split target when no GPU is there to count SMs (keeps splitting tested)


@triton.jit
def _load_kv_tile(
    cache_ptr, table_ptr, kv_pos, kv_mask, offs_d, d_mask, page_size, stride_page, stride_slot, head_offset
):
    """Rows kv_pos of one sequence's keys (or values) for one KV head: [BLOCK_N, BLOCK_D]."""
    page = tl.load(table_ptr + kv_pos // page_size, mask=kv_mask, other=0)
    rows = page * stride_page + (kv_pos % page_size) * stride_slot + head_offset
    return tl.load(cache_ptr + rows[:, None] + offs_d[None, :], mask=kv_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    qk_scale, page_size, split_len, num_splits, window,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_table, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr, SPLIT: tl.constexpr, FP32_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    cache_ty = k_ptr.dtype.element_ty

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g
    q = tl.load(
        q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(cache_ty)  # the twin rounds q to the cache dtype too
    if FP32_DOT:
        q = q.to(tl.float32)

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
        k = _load_kv_tile(k_ptr, table, kv_pos, kv_mask, offs_d, d_mask, page_size, stride_kp, stride_ks, head_offset)
        v = _load_kv_tile(v_ptr, table, kv_pos, kv_mask, offs_d, d_mask, page_size, stride_kp, stride_ks, head_offset)
        if FP32_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
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
        part = (seq * GROUP * tl.num_programs(1) + heads) * num_splits + split  # [seq, head, split] flattened
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=out_mask)
        tl.store(part_max_ptr + part, m_i, mask=g_mask)
        tl.store(part_sum_ptr + part, l_i, mask=g_mask)
    else:
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )


@triton.jit
def _combine_splits(
    part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr, num_splits, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """out[seq, head] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s, M the largest split max."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    part = (seq * tl.num_programs(1) + head) * num_splits + offs_s
    m = tl.load(part_max_ptr + part, mask=s_mask, other=NEG_BIG)
    l_s = tl.load(part_sum_ptr + part, mask=s_mask, other=0.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
        mask=s_mask[:, None] & (offs_d < HEAD_DIM)[None, :],
        other=0.0,
    )
    w = tl.exp2(m - tl.max(m, axis=0))  # splits with no keys in range have l = 0 and add nothing
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_s * w, axis=0)
    tl.store(
        out_ptr + seq * stride_ot + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, tiles_ptr, out_ptr, qk_scale, page_size, window,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_table, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr, FP32_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    cache_ty = k_ptr.dtype.element_ty
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
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(cache_ty)
    if FP32_DOT:
        q = q.to(tl.float32)
    q_pos = pos0 + offs_m

    # Keys up to the tile's last query position; with a window, from the first row's earliest key.
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
        k = _load_kv_tile(k_ptr, table, kv_pos, kv_mask, offs_d, d_mask, page_size, stride_kp, stride_ks, head_offset)
        v = _load_kv_tile(v_ptr, table, kv_pos, kv_mask, offs_d, d_mask, page_size, stride_kp, stride_ks, head_offset)
        if FP32_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
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

    # Rows past num_rows may have no key at all (l = 0); they are never stored.
    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


@cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _num_splits(num_programs: int, max_len: int, device: torch.device, block_n: int) -> tuple[int, int]:
    """(splits, keys per split, a multiple of block_n) so decode runs about two programs per SM."""
    target = INTERPRETER_PROGRAMS if device.type != "cuda" else 2 * _num_sms(device)
    wanted = min(-(-target // num_programs), max(1, max_len // MIN_SPLIT_TOKENS))
    if wanted <= 1:
        return 1, max_len
    split_len = -(-max_len // wanted)
    split_len = -(-split_len // block_n) * block_n
    return -(-max_len // split_len), split_len


def _blocks(head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_N, num_warps): wide heads take narrower key tiles to stay within registers."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_n = 64 if block_d <= 128 else 32
    return block_d, block_n, 4 if block_d <= 128 else 8


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
) -> torch.Tensor:
    """Causal paged attention -> [num_tokens, Hq, D] in the cache dtype; see the module docstring.

    `page_runs` is accepted for the signature's sake and not needed: the kernels read pages in place.
    Expects k_cache / v_cache with contiguous heads (the cache's own layout) and q with a unit last stride.
    """
    out = launch.empty(q.shape, k_cache.dtype, q.device)
    if q.shape[0] == 0:
        return out
    args = (q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window)
    return launch_paged(_decode_kernel, _prefill_kernel, *args, out, _blocks(q.shape[2]), k_cache.dtype)


def launch_paged(
    decode_kernel,
    prefill_kernel,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,
    blocks: tuple[int, int, int],
    tile_dtype: torch.dtype,
    constants: dict | None = None,
    prefill_inputs: tuple = (),
    prefill_constants: dict | None = None,
    may_decode: bool = True,
) -> torch.Tensor:
    """Launch a pair of paged attention kernels (this module's, or kv_quant.py's over quantized pages) into `out`:
    the decode kernel, split along the keys where a few sequences would leave the GPU idle, when every sequence
    has one new token (and `may_decode`); else the prefill kernel over tiles of query rows.

    `blocks` is (BLOCK_D, BLOCK_N, num_warps); `tile_dtype` the dtype of the tiles the dots take; `constants` go
    to both kernels, `prefill_inputs` (placed before `out`) and `prefill_constants` to the prefill kernel only.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    fp32_dot = launch.dot_in_fp32(tile_dtype)
    block_d, block_n, num_warps = blocks
    window = sliding_window if sliding_window is not None else 0
    common = dict(
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        HAS_WINDOW=sliding_window is not None,
        FP32_DOT=fp32_dot,
        DOT_PRECISION="ieee" if fp32_dot else "tf32",  # fp32 tiles stay exact; for 16-bit tiles it changes nothing
        num_warps=num_warps,
        **(constants or {}),
    )
    strides = (
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
    )  # fmt: skip
    qk_scale = scale * LOG2E
    page_size = k_cache.shape[1]

    if may_decode and all(n == 1 for n in query_lens):
        num_seqs = len(query_lens)
        num_splits, split_len = _num_splits(num_seqs * num_kv_heads, max(seq_lens_host), q.device, block_n)
        if num_splits > 1:
            part_acc = launch.empty((num_seqs, num_q_heads, num_splits, head_dim), torch.float32, q.device)
            part_max = launch.empty((num_seqs, num_q_heads, num_splits), torch.float32, q.device)
            part_sum = launch.empty((num_seqs, num_q_heads, num_splits), torch.float32, q.device)
        else:
            part_acc = part_max = part_sum = out  # unused: the kernel writes `out` directly
        decode_kernel[(num_seqs, num_kv_heads, num_splits)](
            q, k_cache, v_cache, block_tables, seq_lens, out, part_acc, part_max, part_sum,
            qk_scale, page_size, split_len, num_splits, window, *strides,
            BLOCK_G=max(16, triton.next_power_of_2(group)), SPLIT=num_splits > 1, **common,
        )  # fmt: skip
        if num_splits > 1:
            _combine_splits[(num_seqs, num_q_heads)](
                part_acc, part_max, part_sum, out, num_splits, out.stride(0), out.stride(1),
                HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
            )  # fmt: skip
        return out

    block_m = 64 if max(query_lens) > 32 else (32 if max(query_lens) > 16 else 16)
    tiles = _tiles(query_lens, seq_lens_host, block_m).to(q.device, non_blocking=True)
    prefill_kernel[(tiles.shape[0], num_q_heads)](
        q, k_cache, v_cache, block_tables, tiles, *prefill_inputs, out, qk_scale, page_size, window, *strides,
        BLOCK_M=block_m, **common, **(prefill_constants or {}),
    )  # fmt: skip
    return out


def _tiles(query_lens: Sequence[int], seq_lens_host: Sequence[int], block_m: int) -> torch.Tensor:
    """[num_tiles, 5] int32 rows (sequence, first token row, rows, position of first row, sequence length)."""
    rows: list[tuple[int, int, int, int, int]] = []
    token = 0
    for seq, (q_len, kv_len) in enumerate(zip(query_lens, seq_lens_host)):
        for offset in range(0, q_len, block_m):
            n = min(block_m, q_len - offset)
            rows.append((seq, token + offset, n, kv_len - q_len + offset, kv_len))
        token += q_len
    return torch.tensor(rows, dtype=torch.int32).view(-1, 5)
