"""RMSNorm in plain torch, computed in float32 like the reference implementations."""

from __future__ import annotations

import torch


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return (norm(x [+ residual]) * weight, the summed residual or None).

    With `residual`, x + residual is the new residual stream, so the fused op returns it as well.
    """
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), residual
