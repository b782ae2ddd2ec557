"""x @ W.T for W held as rows of GGUF blocks on a CUDA GPU: each tile of W is dequantized in registers from the
file's bytes, so the weight stays at the file's size (a 1B Q4_K_M model: 0.8 GB, not 2.5 GB of bfloat16).

One kernel for every type; `TYPE` (a constexpr) picks the unpacking (kernels/triton/gguf_unpack.py). Each step
of the K loop reads whole blocks: NB blocks of 32 values, or one super-block of 256. Their bytes are loaded as
tiles of contiguous bytes and cut into planes by shifts, and x is read in the planes' column order.

Each program computes a [BLOCK_M, BLOCK_N] tile of the output over a slice of K, in one of two forms:

    GEMV  a decode step's 1..GEMV_ROWS rows: multiply and reduce on the CUDA cores, with each group's scale
          and offset applied to the group's sums (few rows leave the tensor cores nothing to do)
    dot   more rows: the planes go to tl.dot as weights of x's dtype, summed in float32

Few rows leave too few tiles to fill the GPU, so K is split into slices of whole steps and the slices' float32
partial sums added afterwards, in a fixed order. Where K is not split, the kernel adds the bias and rounds to x's
dtype itself, in one launch: an eager decode-step call spends several times its GPU time on the host, so every
launch saved counts.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.torch_ref.gguf_blocks import BLOCKS
from kernels.triton import launch
from kernels.triton.gguf_unpack import small_blocks, super_blocks

# The constexpr each type's unpacking is chosen by (gguf_unpack.py branches on these numbers).
TYPE_IDS = {name: i for i, name in enumerate(BLOCKS)}

# Up to this many rows the GEMV form runs: its multiply-adds grow with the rows while the unpacking does not, and
# at about four rows they catch up with the time the weight's bytes take to arrive (H200: 4.2 TB/s, ~33 T
# float32 FMA/s, ~0.56 B per Q4_K weight).
GEMV_ROWS = 4


class Tiles(NamedTuple):
    """One launch's shape: output tile, 32-value blocks per K step (super-block types take one super-block),
    warps, whether the GEMV form runs, and how many programs per streaming multiprocessor K splitting aims at."""

    block_m: int
    block_n: int
    blocks_per_step: int
    num_warps: int
    gemv: bool
    programs_per_sm: int


def tiles_for(num_rows: int) -> Tiles:
    """The tile settings for `num_rows` rows of x.

    GEMV: 16 weight rows by 256 columns per step (2.3 KB of Q4_K, 4.4 KB of Q8_0 over 128 threads), and K split
    until about 8 programs run per SM: a decode step is one pass over the weight, so the bytes in flight
    (programs x step) must cover the memory latency. dot: 16 rows is tl.dot's least; prompts take the wide
    tiles that reuse each dequantized weight over 64 or 128 rows of x; 128 x 64 with 4 warps, since 128 x 128
    with 8 warps runs out of shared memory for Q4_K.
    """
    if num_rows <= GEMV_ROWS:
        block_m = triton.next_power_of_2(num_rows)
        return Tiles(block_m, 16, 8 if block_m == 1 else 4, 4, True, 8)
    if num_rows <= 16:
        return Tiles(16, 32, 4, 4, False, 4)
    if num_rows <= 64:
        return Tiles(64, 64, 4, 4, False, 2)
    return Tiles(128, 64, 4, 4, False, 2)


@triton.jit
def _matmul_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_xm,
    row_bytes,
    blocks_per_split,
    TYPE: tl.constexpr,
    VALUES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NB: tl.constexpr,
    GEMV: tl.constexpr,
    DOT_FP32: tl.constexpr,
    FINAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows past the end read the last real row (stores are masked), so no byte load needs a mask.
    rows = w_ptr + tl.minimum(offs_n, N - 1).to(tl.int64) * row_bytes  # [BLOCK_N]
    x_rows = x_ptr + tl.minimum(offs_m, M - 1).to(tl.int64) * stride_xm  # [BLOCK_M]
    num_blocks = K // VALUES
    kb_start = pid_k * blocks_per_split
    kb_stop = tl.minimum(kb_start + blocks_per_split, num_blocks)
    col_stop = kb_stop * VALUES  # x is zero past the slice, which cancels the clamped blocks of a last step
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_start, kb_stop, NB):
        if VALUES == 32:
            acc = small_blocks(acc, rows, x_rows, kb, col_stop, num_blocks, TYPE, NB, GEMV, DOT_FP32)
        else:
            acc = super_blocks(acc, rows, x_rows, kb, col_stop, TYPE, GEMV, DOT_FP32)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if FINAL:  # K in one slice: the result itself, bias added in float32 and rounded once to out's dtype
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask)
    else:  # slice pid_k's float32 sums, added up by the launcher
        tl.store(out_ptr + (pid_k * M).to(tl.int64) * N + offs_m[:, None] * N + offs_n[None, :], acc, mask)


def _cdiv(a: int, b: int) -> int:
    # not triton.cdiv: that is a jit function, and calling one from Python costs ~10 us of the host's time
    return -(-a // b)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _num_splits(num_tiles: int, num_steps: int, programs_per_sm: int, device: torch.device) -> int:
    """K slices per tile so that about `programs_per_sm` programs run per streaming multiprocessor (1 on the
    interpreter), each keeping at least one K step."""
    if device.type != "cuda":
        return 1
    sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    return max(1, min(-(-programs_per_sm * sms // num_tiles), num_steps))


def matmul(
    x2: torch.Tensor, blocks: torch.Tensor, type_name: str, tiles: Tiles, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x2 [M, K] (unit stride along K) @ W.T (+ bias) [M, N] in x2's dtype, with `tiles`. Unsplit K is one launch
    that adds the bias and rounds; split K leaves float32 slices [splits, M, N], summed here in slice order."""
    num_rows, num_cols = x2.shape
    num_out = blocks.shape[0]
    values = BLOCKS[type_name][0]
    blocks_per_step = tiles.blocks_per_step if values == 32 else 1
    num_blocks = num_cols // values
    tiles_m, tiles_n = _cdiv(num_rows, tiles.block_m), _cdiv(num_out, tiles.block_n)
    num_steps = _cdiv(num_blocks, blocks_per_step)
    splits = _num_splits(tiles_m * tiles_n, num_steps, tiles.programs_per_sm, x2.device)
    blocks_per_split = _cdiv(num_steps, splits) * blocks_per_step
    splits = _cdiv(num_blocks, blocks_per_split)
    dot_fp32 = launch.dot_in_fp32(x2.dtype)
    # triton's interpreter rounds float32 to bfloat16 by truncation (3.9), so there torch rounds instead
    final = splits == 1 and not (dot_fp32 and x2.dtype == torch.bfloat16)
    if final:
        out = launch.empty((num_rows, num_out), x2.dtype, x2.device)
    else:
        out = launch.empty((splits, num_rows, num_out), torch.float32, x2.device)
    _matmul_kernel[(tiles_m, tiles_n, splits)](
        x2,
        blocks,
        out,
        bias if bias is not None else out,
        num_rows,
        num_out,
        num_cols,
        x2.stride(0),
        blocks.shape[1],
        blocks_per_split,
        TYPE=TYPE_IDS[type_name],
        VALUES=values,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        NB=blocks_per_step,
        GEMV=tiles.gemv,
        DOT_FP32=dot_fp32,
        FINAL=final,
        HAS_BIAS=bias is not None,
        num_warps=tiles.num_warps,
    )
    if final:
        return out
    total = out.sum(0)
    if bias is not None:
        total += bias.float()
    return total.to(x2.dtype)


def linear(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) for W = rows of `type_name` blocks [N, row bytes] uint8 (the file's layout):
    float32 sums, bias added in float32, one rounding to x.dtype at the end, as the twin
    (kernels/torch_ref/gguf_blocks.linear)."""
    num_cols = x.shape[-1]
    x2 = x.reshape(-1, num_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = matmul(x2, blocks, type_name, tiles_for(x2.shape[0]), bias)
    return out.reshape(*x.shape[:-1], blocks.shape[0])
