"""Linear layers over GGUF blocks for bfloat16 x, through the C kernels: kquant_matmul.c for the K-quants
(Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS: super-blocks of 256 values), block32_matmul.c for ggml's 32-value types (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, IQ4_NL, MXFP4). Both read weights repacked at load 16 rows at a time (`pack`; the layout is
kernels/torch_ref/gguf_repack.py's, named by the type with "x16" after it, the same size as the file's).

On CPUs with AVX512-VNNI both quantize x to 8 bits per block of the weight's type (256 or 32 values) and sum
integer products, as llama.cpp does (faster than bfloat16 dot products on the same weights: kquant_matmul.c
says why). Both do the same on AVX2 (block32_avx2.h, kquant_avx2.h: outputs
equal to the bit, but for Q4_K, Q5_K and Q6_K, whose sub-block scales are applied in int32 there, within
rounding); elsewhere they multiply bfloat16 x as it is.

Every row count (decode steps, speculative steps, prompts) goes through the kernel, and each row's result is
independent of the others. Anything else (another type, float32 x, CUDA, no compiler) returns None and the
next candidate runs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import NamedTuple

import torch

from kernels.cpu import build
from kernels.torch_ref import gguf_repack


class _Type(NamedTuple):
    source: str  # the C file (without .c) whose kernel reads it
    number: int  # ggml's type number, as the C files name it
    values: int  # values per block: x goes through the kernel in groups of this many
    bytes: int  # bytes per block
    group: int = 1  # weight rows per row of the blocks tensor: 16 in the repacked layout


# the layouts the kernels read: file types, or their repacked forms
TYPES = {
    "Q4_0x16": _Type("block32_matmul", 2, 32, 18, 16),
    "Q4_1x16": _Type("block32_matmul", 3, 32, 20, 16),
    "Q5_0x16": _Type("block32_matmul", 6, 32, 22, 16),
    "Q5_1x16": _Type("block32_matmul", 7, 32, 24, 16),
    "Q8_0x16": _Type("block32_matmul", 8, 32, 34, 16),
    "IQ4_NLx16": _Type("block32_matmul", 20, 32, 18, 16),
    "MXFP4x16": _Type("block32_matmul", 39, 32, 17, 16),
    "Q4_Kx16": _Type("kquant_matmul", 12, 256, 144, 16),
    "Q5_Kx16": _Type("kquant_matmul", 13, 256, 176, 16),
    "Q6_Kx16": _Type("kquant_matmul", 14, 256, 210, 16),
    "Q2_Kx16": _Type("kquant_matmul", 10, 256, 84, 16),
    "Q3_Kx16": _Type("kquant_matmul", 11, 256, 110, 16),
    "IQ4_XSx16": _Type("kquant_matmul", 23, 256, 136, 16),
}
# No dense path for prompts: the kernels keep up with expanding the weight to bfloat16 and one dense matmul at
# prompt sizes, without the expanded copy, and every row stays independent of the others.

_i64, _ptr, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


def _matmul(source: str):
    # type, x, x stride, blocks, out, out stride, rows, n, k, threads
    args = (_int, _ptr, _i64, _ptr, _ptr, _i64, _i64, _i64, _i64, _i64)
    return build.function(source, source, args, ctypes.c_int)


def path(type_name: str) -> int:
    """The path the compiled kernel for `type_name` takes on this CPU: 2 the 8-bit one (x quantized per block,
    AVX512-VNNI; twin `gguf_blocks.linear_q8`), 1 the same on AVX2, 0 the portable loop (twin
    `gguf_blocks.linear`); -1 where there is no kernel."""
    source = TYPES[type_name].source
    fn = build.function(source, source.replace("_matmul", "_path"), (), ctypes.c_int)
    return -1 if fn is None else fn()


def kernel_type(type_name: str) -> str:
    """The layout a kernel reads a file's `type_name` in: its repacked form ("Q4_K" -> "Q4_Kx16")."""
    return type_name if type_name in TYPES else gguf_repack.repacked_name(type_name)


def supports(type_name: str, device: torch.device | str, dtype: torch.dtype, num_cols: int, num_rows: int) -> bool:
    """True where a weight [num_rows, num_cols] of `type_name` (the file's, or its repacked form) on `device` can
    run through a kernel: rows of whole blocks (multiples of 32 values, 256 for the K-quants) in whole groups
    of 16."""
    kind = TYPES.get(kernel_type(type_name))
    return (
        kind is not None
        and num_rows % gguf_repack.GROUP == 0
        and num_rows > 0
        and num_cols % kind.values == 0
        and num_cols > 0
        and torch.device(device).type == "cpu"
        and dtype == torch.bfloat16
        and _matmul(kind.source) is not None
    )


def pack(blocks: torch.Tensor, type_name: str) -> tuple[torch.Tensor, str]:
    """A weight's file blocks [N, row bytes] in the layout the kernel reads (a new tensor of the same size),
    with that layout's type name; blocks already repacked as they are."""
    if type_name in TYPES:
        return blocks, type_name
    return gguf_repack.repack(blocks, type_name), gguf_repack.repacked_name(type_name)


def linear(
    x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None
) -> torch.Tensor | None:
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() < 1:
        return None
    if bias is not None and (bias.dtype != x.dtype or bias.device.type != "cpu"):
        return None
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    if rows.shape[0] == 0 or not _blocks_ok(blocks, type_name, rows.shape[1]):
        return None
    out = torch.empty(rows.shape[0], blocks.shape[0] * TYPES[type_name].group, dtype=x.dtype)
    call = bind_linear(rows, blocks, type_name, out, torch.get_num_threads())
    if call is None or call[0](*call[1]) != 0:
        return None
    out = out.reshape(*x.shape[:-1], out.shape[1])
    return out if bias is None else out + bias


def bind_linear(
    x: torch.Tensor, blocks: torch.Tensor, type_name: str, out: torch.Tensor, threads: int | ctypes.c_int64
) -> tuple[Callable[..., int], tuple] | None:
    """The kernel and its arguments for out [rows, N] = x [rows, K] @ W.T, both bfloat16 with unit column
    strides (out may be a column slice of a wider buffer), or None where it does not apply. A call returns 0
    when done. Kept by kernels/cpu/plan.py to replay a decode step."""
    kind = TYPES.get(type_name)
    if kind is None or x.dim() != 2 or out.dim() != 2 or x.stride(1) != 1 or out.stride(1) != 1:
        return None
    if x.dtype != torch.bfloat16 or out.dtype != torch.bfloat16 or not _blocks_ok(blocks, type_name, x.shape[1]):
        return None
    num_rows = blocks.shape[0] * kind.group
    fn = _matmul(kind.source)
    if fn is None or out.shape != (x.shape[0], num_rows):
        return None
    args = (kind.number, x.data_ptr(), x.stride(0), blocks.data_ptr(), out.data_ptr(), out.stride(0))
    return fn, (*args, x.shape[0], num_rows, x.shape[1], threads)


def _blocks_ok(blocks: torch.Tensor, type_name: str, num_cols: int) -> bool:
    kind = TYPES.get(type_name)
    return (
        kind is not None
        and blocks.device.type == "cpu"
        and blocks.dtype == torch.uint8
        and blocks.dim() == 2
        and blocks.is_contiguous()
        and num_cols > 0
        and num_cols % kind.values == 0
        and blocks.shape[1] == num_cols // kind.values * kind.bytes * kind.group
    )
