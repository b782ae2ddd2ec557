"""x @ W.T for W held as rows of GGUF blocks on a CUDA GPU: each tile of W is dequantized in registers from the
file's bytes, so the weight stays at the file's size (a 1B Q4_K_M model: 0.8 GB, not 2.5 GB of bfloat16).

One kernel for every type; `TYPE` (a constexpr) picks the dequantization, and each weight value is computed
from its absolute column k, so a tile may start and end anywhere inside a block. The layouts are the file's
(kernels/torch_ref/gguf_blocks.py describes each); every byte is read with a gather, and the neighbouring
values of a tile that share a block's scale read the same bytes, which the GPU serves from its L1 cache.

Each program computes a [BLOCK_M, BLOCK_N] tile of the output over a slice of K: a decode step's few rows
leave too few tiles to fill the GPU, so K is split and the slices' float32 partial sums added afterwards, in
a fixed order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.torch_ref.gguf_blocks import BLOCKS
from kernels.triton import launch

# The constexpr each type's dequantization is chosen by.
TYPE_IDS = {name: i for i, name in enumerate(BLOCKS)}


@triton.jit
def _f16(ptr, mask):
    """The little-endian float16 at byte pointers `ptr`, as float32."""
    lo = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _byte(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _nibble(ptr, j, mask):
    """Value j (0..31) of 16 bytes of nibbles at `ptr`: the low nibbles give 0..15, the high ones 16..31."""
    return (_byte(ptr + (j % 16), mask) >> ((j // 16) * 4)) & 15


@triton.jit
def _level(q):
    """IQ4_NL/IQ4_XS: a nibble's level (gguf_blocks.KVALUES) as a select chain: triton has no constant tables."""
    v = tl.where(q == 0, -127, 0)
    v = tl.where(q == 1, -104, v)
    v = tl.where(q == 2, -83, v)
    v = tl.where(q == 3, -65, v)
    v = tl.where(q == 4, -49, v)
    v = tl.where(q == 5, -35, v)
    v = tl.where(q == 6, -22, v)
    v = tl.where(q == 7, -10, v)
    v = tl.where(q == 8, 1, v)
    v = tl.where(q == 9, 13, v)
    v = tl.where(q == 10, 25, v)
    v = tl.where(q == 11, 38, v)
    v = tl.where(q == 12, 53, v)
    v = tl.where(q == 13, 69, v)
    v = tl.where(q == 14, 89, v)
    v = tl.where(q == 15, 113, v)
    return v.to(tl.float32)


@triton.jit
def _k_scale_min(ptr, s, mask):
    """Q4_K/Q5_K: sub-block s's 6-bit scale and min from the 12 bytes at `ptr`."""
    low = s < 4
    a = _byte(ptr + s, mask)  # s < 4: the scale's byte
    b = _byte(ptr + s + 4, mask)  # s < 4: the min's byte; else the low bits of both
    c = _byte(ptr + (s % 4), mask)  # s >= 4: top 2 bits of the scale
    e = _byte(ptr + (s % 4) + 4, mask)  # s >= 4: top 2 bits of the min
    scale = tl.where(low, a & 63, (b & 15) | ((c >> 6) << 4))
    minimum = tl.where(low, b & 63, (b >> 4) | ((e >> 6) << 4))
    return scale.to(tl.float32), minimum.to(tl.float32)


@triton.jit
def _k_quant(row, k, mask, SIZE: tl.constexpr, QS: tl.constexpr, FIFTH: tl.constexpr):
    """Q4_K (FIFTH False) and Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and min."""
    base = row + (k // 256) * SIZE
    j = k % 256
    s, i = j // 32, j % 32
    scale, minimum = _k_scale_min(base + 4, s, mask)
    q = (_byte(base + QS + (s // 2) * 32 + i, mask) >> ((s % 2) * 4)) & 15
    if FIFTH:
        q = q | (((_byte(base + 16 + i, mask) >> s) & 1) << 4)
    return _f16(base, mask) * scale * q.to(tl.float32) - _f16(base + 2, mask) * minimum


@triton.jit
def _dequantize(row, k, mask, TYPE: tl.constexpr):
    """W[n, k] in float32 for byte pointers `row` (each row's start) and columns `k`."""
    if TYPE == 0:  # Q4_0: d, 16 bytes of nibbles
        base = row + (k // 32) * 18
        return _f16(base, mask) * (_nibble(base + 2, k % 32, mask) - 8).to(tl.float32)
    elif TYPE == 1:  # Q4_1: d, m, nibbles
        base = row + (k // 32) * 20
        return _f16(base, mask) * _nibble(base + 4, k % 32, mask).to(tl.float32) + _f16(base + 2, mask)
    elif TYPE == 2:  # Q5_0: d, 32 fifth bits, nibbles
        base = row + (k // 32) * 22
        j = k % 32
        high = (_byte(base + 2 + j // 8, mask) >> (j % 8)) & 1
        return _f16(base, mask) * ((_nibble(base + 6, j, mask) | (high << 4)) - 16).to(tl.float32)
    elif TYPE == 3:  # Q5_1: d, m, fifth bits, nibbles
        base = row + (k // 32) * 24
        j = k % 32
        high = (_byte(base + 4 + j // 8, mask) >> (j % 8)) & 1
        q = _nibble(base + 8, j, mask) | (high << 4)
        return _f16(base, mask) * q.to(tl.float32) + _f16(base + 2, mask)
    elif TYPE == 4:  # Q8_0: d, 32 int8
        base = row + (k // 32) * 34
        q = tl.load(base + 2 + k % 32, mask=mask, other=0).to(tl.int8, bitcast=True)
        return _f16(base, mask) * q.to(tl.float32)
    elif TYPE == 5:  # Q2_K: 16 scale/min bytes, 64 bytes of 2-bit values, d, dmin
        base = row + (k // 256) * 84
        j = k % 256
        half, group, i = j // 128, (j % 128) // 32, j % 32
        sub = _byte(base + j // 16, mask)
        q = (_byte(base + 16 + half * 32 + i, mask) >> (group * 2)) & 3
        d = _f16(base + 80, mask) * (sub & 15).to(tl.float32)
        return d * q.to(tl.float32) - _f16(base + 82, mask) * (sub >> 4).to(tl.float32)
    elif TYPE == 6:  # Q3_K: 32 bytes of high-bit masks, 64 of 2-bit values, 12 of 6-bit scales, d
        base = row + (k // 256) * 110
        j = k % 256
        half, group, i = j // 128, (j % 128) // 32, j % 32
        s = j // 16
        low = (_byte(base + 96 + s % 8, mask) >> ((s // 8) * 4)) & 15
        top = (_byte(base + 104 + s % 4, mask) >> ((s // 4) * 2)) & 3
        scale = ((low | (top << 4)) - 32).to(tl.float32)
        crumb = (_byte(base + 32 + half * 32 + i, mask) >> (group * 2)) & 3
        kept = (_byte(base + i, mask) >> (half * 4 + group)) & 1
        return _f16(base + 108, mask) * scale * (crumb - 4 * (1 - kept)).to(tl.float32)
    elif TYPE == 7:  # Q4_K: d, dmin, 12 scale bytes, nibbles
        return _k_quant(row, k, mask, 144, 16, False)
    elif TYPE == 8:  # Q5_K: d, dmin, 12 scale bytes, 32 bytes of fifth bits, nibbles
        return _k_quant(row, k, mask, 176, 48, True)
    elif TYPE == 9:  # Q6_K: 128 bytes of low nibbles, 64 of high crumbs, 16 int8 scales, d
        base = row + (k // 256) * 210
        j = k % 256
        half, quarter, i = j // 128, (j % 128) // 32, j % 32
        low = (_byte(base + half * 64 + (quarter % 2) * 32 + i, mask) >> ((quarter // 2) * 4)) & 15
        high = (_byte(base + 128 + half * 32 + i, mask) >> (quarter * 2)) & 3
        scale = tl.load(base + 192 + j // 16, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        return _f16(base + 208, mask) * scale * ((low | (high << 4)) - 32).to(tl.float32)
    elif TYPE == 10:  # IQ4_NL: d, nibbles indexing KVALUES
        base = row + (k // 32) * 18
        return _f16(base, mask) * _level(_nibble(base + 2, k % 32, mask))
    else:  # IQ4_XS: d, 16 bits of high scale bits, 4 bytes of low scale nibbles, 8 x 16 bytes of nibbles
        base = row + (k // 256) * 136
        j = k % 256
        s = j // 32
        low = (_byte(base + 4 + s // 2, mask) >> ((s % 2) * 4)) & 15
        top = (_byte(base + 2 + s // 4, mask) >> ((s % 4) * 2)) & 3
        d = _f16(base, mask) * ((low | (top << 4)) - 32).to(tl.float32)
        return d * _level(_nibble(base + 8 + s * 16, j % 32, mask))


@triton.jit
def _matmul_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    row_bytes,
    k_per_split,
    TYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = w_ptr + offs_n[:, None].to(tl.int64) * row_bytes  # [BLOCK_N, 1]
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_stop = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_stop, BLOCK_K):
        k = k0 + offs_k
        x = tl.load(x_rows + k[None, :], mask=(offs_m[:, None] < M) & (k[None, :] < k_stop), other=0.0)
        w = _dequantize(rows, k[None, :], (offs_n[:, None] < N) & (k[None, :] < k_stop), TYPE)
        if DOT_FP32:
            acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    out = out_ptr + (pid_k * M).to(tl.int64) * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _tiles(num_rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): 16 rows is tl.dot's least; prompts take wider tiles."""
    if num_rows <= 16:
        return 16, 32, 128
    if num_rows <= 64:
        return 64, 64, 64
    return 128, 64, 64


def _num_splits(num_tiles: int, num_cols: int, block_k: int, device: torch.device) -> int:
    """K slices per tile so that about two programs run per streaming multiprocessor (1 on the interpreter)."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(-(-2 * sms // num_tiles), num_cols // block_k))


def linear(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) for W = rows of `type_name` blocks [N, row bytes] uint8 (the file's layout):
    float32 sums, one rounding to x.dtype at the end, as the twin (kernels/torch_ref/gguf_blocks.linear)."""
    num_cols = x.shape[-1]
    x2 = x.reshape(-1, num_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    num_rows, num_out = x2.shape[0], blocks.shape[0]
    block_m, block_n, block_k = _tiles(num_rows)
    tiles_m, tiles_n = triton.cdiv(num_rows, block_m), triton.cdiv(num_out, block_n)
    splits = _num_splits(tiles_m * tiles_n, num_cols, block_k, x.device)
    k_per_split = triton.cdiv(triton.cdiv(num_cols, splits), block_k) * block_k
    splits = triton.cdiv(num_cols, k_per_split)
    partial = launch.empty((splits, num_rows, num_out), torch.float32, x.device)
    _matmul_kernel[(tiles_m, tiles_n, splits)](
        x2,
        blocks,
        partial,
        num_rows,
        num_out,
        num_cols,
        x2.stride(0),
        blocks.shape[1],
        k_per_split,
        TYPE=TYPE_IDS[type_name],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_FP32=launch.dot_in_fp32(x.dtype),
    )
    out = partial[0] if splits == 1 else partial.sum(0)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], num_out)
