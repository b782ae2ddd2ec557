"""RMSNorm, rotary embedding and SiLU-and-multiply on bfloat16 CPU tensors through elementwise.c, and the copy
of a decode step's keys and values into their cache slots (bind_write_slots, for a decode plan).

Each takes its op for bfloat16 CPU tensors whose last axis is contiguous and returns None for anything else
(float32 and float16 models, CUDA, odd strides), which goes on to the torch twin.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from kernels.cpu import build

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_MAX_WIDTH = 16384  # rms_norm keeps a row in float32 on the stack
_SIGNATURES = {
    "rms_norm_bf16": (_ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, ctypes.c_float, _i64),
    "rope_bf16": (_ptr, _i64, _ptr, _ptr, _ptr) + (_i64,) * 5,
    "silu_and_mul_bf16": (_ptr, _i64, _ptr, _i64, _i64, _i64),
    "write_slots": (_ptr, _i64, _i64, _ptr, _i64, _i64, _i64, _ptr) + (_i64,) * 5,
}


def _kernel(name: str, restype=None):
    return build.function("elementwise", name, _SIGNATURES[name], restype)


def _rows(x: torch.Tensor) -> torch.Tensor | None:
    """x as a 2-D [rows, last] view with a unit last stride, or None."""
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() < 1 or x.stride(-1) != 1:
        return None
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:  # rows not evenly spaced
        return None


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    # Per-head q/k norms (Qwen3) see [tokens, heads, head_dim] views of the fused projection, whose rows are not
    # evenly spaced past one token: a copy lets every row count take the kernel, so a token's norm is the same
    # whether it comes alone or with others.
    rows = _rows(x)
    if rows is None and x.device.type == "cpu" and x.dtype == torch.bfloat16 and x.dim() >= 1 and x.stride(-1) == 1:
        rows = x.reshape(-1, x.shape[-1])
    res = None if residual is None else _rows(residual)
    if rows is None or (residual is not None and (res is None or residual.shape != x.shape)):
        return None
    out = torch.empty(rows.shape, dtype=x.dtype)
    summed = None if residual is None else torch.empty(rows.shape, dtype=x.dtype)
    call = bind_rms_norm(rows, res, summed, weight, eps, out, torch.get_num_threads())
    if call is None:
        return None
    call[0](*call[1])
    return out.view(x.shape), None if summed is None else summed.view(x.shape)


def bind_rms_norm(x, residual, summed, weight, eps: float, out, threads) -> tuple[Callable, tuple] | None:
    """The kernel and its arguments for out = RMSNorm(x + residual) * weight (summed = x + residual) on 2-D
    bfloat16 rows with unit last strides, or None. Kept by kernels/cpu/plan.py to replay a decode step."""
    width = x.shape[1]
    if weight.dtype != torch.bfloat16 or weight.shape != (width,) or not weight.is_contiguous() or width > _MAX_WIDTH:
        return None
    if out.stride(1) != 1 or (summed is not None and summed.stride(1) != 1):
        return None
    fn = _kernel("rms_norm_bf16")
    if fn is None:
        return None
    args = (
        x.data_ptr(),
        x.stride(0),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        None if summed is None else summed.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        width,
        eps,
        threads,
    )
    return fn, args


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() != 3:
        return None
    out = torch.empty(x.shape, dtype=x.dtype)
    call = bind_rope(x, cos, sin, out, torch.get_num_threads())
    if call is None:
        return None
    call[0](*call[1])
    return out


def bind_rope(x, cos, sin, out, threads) -> tuple[Callable, tuple] | None:
    """The kernel and its arguments for rotating x [tokens, heads, head_dim] (heads packed, tokens at any
    stride) into a contiguous out of the same shape, or None."""
    tokens, heads, head_dim = x.shape
    rot = cos.shape[-1]
    if x.stride(2) != 1 or x.stride(1) != head_dim or rot % 2 or rot > head_dim or not out.is_contiguous():
        return None
    for table in (cos, sin):
        if table.dtype != torch.bfloat16 or table.shape != (tokens, rot) or not table.is_contiguous():
            return None
    fn = _kernel("rope_bf16")
    if fn is None:
        return None
    return fn, (
        x.data_ptr(),
        x.stride(0),
        cos.data_ptr(),
        sin.data_ptr(),
        out.data_ptr(),
        tokens,
        heads,
        head_dim,
        rot,
        threads,
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    rows = _rows(x)
    if rows is None or rows.shape[1] % 2:
        return None
    out = torch.empty(*x.shape[:-1], rows.shape[1] // 2, dtype=x.dtype)
    call = bind_silu_and_mul(rows, out.view(rows.shape[0], -1), torch.get_num_threads())
    if call is None:
        return None
    call[0](*call[1])
    return out


def bind_silu_and_mul(x, out, threads) -> tuple[Callable, tuple] | None:
    """The kernel and its arguments for out [rows, n] = silu(x[:, :n]) * x[:, n:], x [rows, 2n], or None."""
    fn = _kernel("silu_and_mul_bf16")
    if fn is None or not out.is_contiguous() or x.stride(1) != 1:
        return None
    return fn, (x.data_ptr(), x.stride(0), out.data_ptr(), x.shape[0], x.shape[1] // 2, threads)


def bind_write_slots(src, cache, slots) -> tuple[Callable, tuple] | None:
    """The kernel and its arguments for cache[slot // page_size, slot % page_size] = src[i] (slot = slots[i]), or
    None: src [rows, heads, dim] and cache [num_pages, page_size, heads, dim] (any strides, each head's row
    contiguous) of one dtype on the CPU, slots contiguous int64 [rows] (a batch's slot mapping). The call
    returns -1 for a slot outside the cache."""
    rows, heads, dim = src.shape
    if cache.device.type != "cpu" or cache.dim() != 4 or cache.dtype != src.dtype or cache.shape[2:] != src.shape[1:]:
        return None
    if cache.stride(3) != 1 or src.stride(2) != 1:
        return None
    if slots.dtype != torch.int64 or slots.shape != (rows,) or not slots.is_contiguous():
        return None
    fn = _kernel("write_slots", ctypes.c_int)
    if fn is None:
        return None
    size = cache.element_size()
    return fn, (
        src.data_ptr(),
        src.stride(0) * size,
        src.stride(1) * size,
        cache.data_ptr(),
        *(stride * size for stride in cache.stride()[:3]),
        slots.data_ptr(),
        cache.shape[0],
        cache.shape[1],
        rows,
        heads,
        dim * size,
    )
