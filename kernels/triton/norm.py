"""RMSNorm with an optional fused residual add, in Triton (twin: `kernels.torch_ref.norm.rms_norm`).

One program per row. The rounding follows the twin: the residual sum is rounded to the input dtype (it is
the new residual stream), the normalized row is rounded to the input dtype before the weight multiplies it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton import launch


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, stride_x, stride_r, num_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * num_cols + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / num_cols + eps)
    h = (x * inv_rms).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * num_cols + cols, (h * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return (norm(x [+ residual]) * weight, the summed residual or None) over the last axis of x.

    A row lives in registers, so the candidate in `kernels.triton` sends rows wider than 16384 to the twin.
    """
    num_cols = x.shape[-1]
    x2 = x.reshape(-1, num_cols)  # a copy only for views whose rows are not evenly spaced (q/k heads)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    r2 = None
    if residual is not None:
        r2 = residual.reshape(-1, num_cols)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
    out = launch.empty(x.shape, torch.promote_types(x.dtype, weight.dtype), x.device)
    residual_out = launch.empty(x.shape, x.dtype, x.device) if residual is not None else None
    num_rows = x2.shape[0]
    if num_rows:
        block = triton.next_power_of_2(num_cols)
        _rms_norm_kernel[(num_rows,)](
            x2, r2 if r2 is not None else x2, weight, out, residual_out if residual_out is not None else out,
            x2.stride(0), r2.stride(0) if r2 is not None else 0, num_cols, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(16, max(1, block // 256)),
        )  # fmt: skip
    return out, residual_out
