"""Linear layers over GGUF blocks (Q4_K, Q5_K, Q6_K and Q8_0) for bfloat16 x, through the C kernel (kquant_matmul.c).

On CPUs with AVX512-VNNI the kernel quantizes x to 8 bits per 256 values and sums integer products, as
llama.cpp does (2.1x faster than bfloat16 dot products on the same weights, kquant_matmul.c says how it was
measured); elsewhere it multiplies bfloat16 x as it is.

Every row count (decode steps, speculative steps, prompts) goes through the kernel, and each row's result is
independent of the others. Anything else
(another type, float32 x, CUDA, no compiler) returns None and the next candidate runs.
"""

from __future__ import annotations

import ctypes

import torch

from kernels.cpu import build

TYPES = {"Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}  # ggml's type numbers, as the C file names them
BLOCK_BYTES = {"Q8_0": 272, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}  # bytes per 256 values (eight Q8_0 blocks)
BLOCK_VALUES = 256
# No dense path for prompts: with weight rows taken in L2-sized chunks the kernel beat expanding the weight
# to bfloat16 and one dense matmul at every size measured ([8192, 2048] Q4_K, 2 cores: 16.1 against 25.7 ms
# at 128 rows, 69 against 92 at 512, 228 against 322 at 1682), and every row stays independent of the others.

_i64, _ptr, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


def _matmul():
    # type, x, x stride, blocks, out, out stride, rows, n, k, threads
    args = (_int, _ptr, _i64, _ptr, _ptr, _i64, _i64, _i64, _i64, _i64)
    return build.function("kquant_matmul", "kquant_matmul", args, ctypes.c_int)


def path() -> int:
    """The path the compiled kernel takes on this CPU: 2 the 8-bit one (x quantized per 256 values, AVX512-VNNI;
    twin `gguf_blocks.linear_q8`), 0 the portable loop (twin `gguf_blocks.linear`); -1 where there is no kernel."""
    fn = build.function("kquant_matmul", "kquant_path", (), ctypes.c_int)
    return -1 if fn is None else fn()


def supports(type_name: str, device: torch.device | str, dtype: torch.dtype, num_cols: int) -> bool:
    """True where rows of `num_cols` values of `type_name` on `device` can stay in their blocks and run through
    this kernel (it takes x 256 values at a time, so rows must hold whole multiples of 256)."""
    return (
        type_name in TYPES
        and num_cols % BLOCK_VALUES == 0
        and torch.device(device).type == "cpu"
        and dtype == torch.bfloat16
        and _matmul() is not None
    )


def linear(
    x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None
) -> torch.Tensor | None:
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() < 1:
        return None
    num_cols = x.shape[-1]
    if not _blocks_ok(blocks, type_name, num_cols):
        return None
    if bias is not None and (bias.dtype != x.dtype or bias.device.type != "cpu"):
        return None
    rows = x.reshape(-1, num_cols)
    fn = _matmul()
    if fn is None or rows.shape[0] == 0:
        return None
    rows = rows.contiguous()
    num_rows = blocks.shape[0]
    out = torch.empty(rows.shape[0], num_rows, dtype=x.dtype)
    status = fn(
        TYPES[type_name],
        rows.data_ptr(),
        rows.stride(0),
        blocks.data_ptr(),
        out.data_ptr(),
        out.stride(0),
        rows.shape[0],
        num_rows,
        num_cols,
        torch.get_num_threads(),
    )
    if status != 0:
        return None
    out = out.reshape(*x.shape[:-1], num_rows)
    return out if bias is None else out + bias


def _blocks_ok(blocks: torch.Tensor, type_name: str, num_cols: int) -> bool:
    return (
        type_name in TYPES
        and blocks.device.type == "cpu"
        and blocks.dtype == torch.uint8
        and blocks.dim() == 2
        and blocks.is_contiguous()
        and num_cols % BLOCK_VALUES == 0
        and blocks.shape[1] == num_cols // BLOCK_VALUES * BLOCK_BYTES[type_name]
    )
