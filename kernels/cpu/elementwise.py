"""RMSNorm, rotary embedding and SiLU-and-multiply on bfloat16 CPU tensors through elementwise.c.

Each takes its op for bfloat16 CPU tensors whose last axis is contiguous and returns None for anything else
(float32 and float16 models, CUDA, odd strides), which goes on to the torch twin.
"""

from __future__ import annotations

import ctypes

import torch

from kernels.cpu import build

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_MAX_WIDTH = 16384  # rms_norm keeps a row in float32 on the stack
_SIGNATURES = {
    "rms_norm_bf16": (_ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, ctypes.c_float, _i64),
    "rope_bf16": (_ptr, _i64, _ptr, _ptr, _ptr) + (_i64,) * 5,
    "silu_and_mul_bf16": (_ptr, _i64, _ptr, _i64, _i64, _i64),
}


def _kernel(name: str):
    return build.function("elementwise", name, _SIGNATURES[name])


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
    rows = _rows(x)
    res = None if residual is None else _rows(residual)
    if rows is None or (residual is not None and (res is None or residual.shape != x.shape)):
        return None
    width = rows.shape[1]
    if weight.dtype != torch.bfloat16 or weight.shape != (width,) or not weight.is_contiguous() or width > _MAX_WIDTH:
        return None
    fn = _kernel("rms_norm_bf16")
    if fn is None:
        return None
    out = torch.empty(x.shape, dtype=x.dtype)
    summed = None if residual is None else torch.empty(x.shape, dtype=x.dtype)
    fn(
        rows.data_ptr(),
        rows.stride(0),
        None if res is None else res.data_ptr(),
        0 if res is None else res.stride(0),
        None if summed is None else summed.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        rows.shape[0],
        width,
        eps,
        torch.get_num_threads(),
    )
    return out, summed


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() != 3:
        return None
    tokens, heads, head_dim = x.shape
    rot = cos.shape[-1]
    if x.stride(2) != 1 or x.stride(1) != head_dim or rot % 2 or rot > head_dim:
        return None
    for table in (cos, sin):
        if table.dtype != torch.bfloat16 or table.shape != (tokens, rot) or not table.is_contiguous():
            return None
    fn = _kernel("rope_bf16")
    if fn is None:
        return None
    out = torch.empty(x.shape, dtype=x.dtype)
    fn(
        x.data_ptr(),
        x.stride(0),
        cos.data_ptr(),
        sin.data_ptr(),
        out.data_ptr(),
        tokens,
        heads,
        head_dim,
        rot,
        torch.get_num_threads(),
    )
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    rows = _rows(x)
    if rows is None or rows.shape[1] % 2:
        return None
    fn = _kernel("silu_and_mul_bf16")
    if fn is None:
        return None
    half = rows.shape[1] // 2
    out = torch.empty(*x.shape[:-1], half, dtype=x.dtype)
    fn(rows.data_ptr(), rows.stride(0), out.data_ptr(), rows.shape[0], half, torch.get_num_threads())
    return out
