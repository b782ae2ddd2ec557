"""SiLU-and-multiply in Triton (twin: `kernels.torch_ref.activation.silu_and_mul`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton import launch

BLOCK = 1024  # output columns per program


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, num_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < num_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + num_cols + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * num_cols + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x is [..., 2 * n] = [gate | up]; returns silu(gate) * up, [..., n]."""
    num_cols = x.shape[-1] // 2
    out = launch.empty((*x.shape[:-1], num_cols), x.dtype, x.device)
    x2 = x.reshape(-1, 2 * num_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if x2.shape[0] and num_cols:
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(num_cols, BLOCK))](
            x2, out, x2.stride(0), num_cols, BLOCK=min(BLOCK, triton.next_power_of_2(num_cols))
        )
    return out
