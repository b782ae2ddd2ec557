"""4-bit weight-only linear layers for a few rows of bfloat16 x, through the C kernel (int4_matmul.c).

It takes the `linear_int4` op for 1 to DENSE_FROM_ROWS - 1 rows (decode steps, speculative steps) on a CPU
whose packed layout is the 64-row block one and which has AVX512-BF16; prompt-sized inputs stay with the
dense path, and anything else (float32 or float16 x, other layouts, CUDA) returns None. Even one row is
faster here than through torch's kernel, and each row's result does not depend on how many rows came with it, so a speculative step's verify pass
computes each token's projections exactly as decoding it alone would.
"""

from __future__ import annotations

import ctypes

import torch

from kernels.cpu import build
from kernels.torch_ref.quant import DENSE_FROM_ROWS, row_block

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_BLOCK = 64  # the kernel reads this row-block layout only


def _kernel():
    # x, x stride, packed, scales, packed_low, scales_low, out, out stride, rows, n, k, group, threads
    args = (_ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i64) + (_i64,) * 5
    return build.function("int4_matmul", "int4_matmul", args, ctypes.c_int)


def _plane_ok(packed: torch.Tensor, scales: torch.Tensor, num_rows: int, num_cols: int, group_size: int) -> bool:
    return (
        packed.device.type == "cpu"
        and packed.dtype == torch.uint8
        and packed.shape == (num_rows, num_cols // 2)
        and packed.is_contiguous()
        and scales.dtype == torch.bfloat16
        and scales.shape == (num_cols // group_size, num_rows, 2)
        and scales.is_contiguous()
    )


def linear_int4(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales_and_zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    low: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | None:
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() < 1:
        return None
    num_rows, num_cols = packed.shape[0], packed.shape[1] * 2
    rows = x.reshape(-1, x.shape[-1])
    if x.shape[-1] != num_cols or not 1 <= rows.shape[0] < DENSE_FROM_ROWS or group_size % 2 or num_cols % group_size:
        return None
    planes = [(packed, scales_and_zeros)] + ([low] if low is not None else [])
    if not all(_plane_ok(p, s, num_rows, num_cols, group_size) for p, s in planes):
        return None
    if bias is not None and (bias.dtype != x.dtype or bias.device.type != "cpu"):
        return None
    if num_rows % _BLOCK or row_block(num_rows, num_cols) != _BLOCK:
        return None
    fn = _kernel()
    if fn is None:
        return None
    rows = rows.contiguous()
    out = torch.empty(rows.shape[0], num_rows, dtype=x.dtype)
    low_packed, low_scales = (low[0].data_ptr(), low[1].data_ptr()) if low is not None else (None, None)
    status = fn(
        rows.data_ptr(),
        rows.stride(0),
        packed.data_ptr(),
        scales_and_zeros.data_ptr(),
        low_packed,
        low_scales,
        out.data_ptr(),
        out.stride(0),
        rows.shape[0],
        num_rows,
        num_cols,
        group_size,
        torch.get_num_threads(),
    )
    if status != 0:
        return None
    out = out.reshape(*x.shape[:-1], num_rows)
    return out if bias is None else out + bias
