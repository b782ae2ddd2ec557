"""Rotary position embedding in the "rotate half" layout used by Hugging Face checkpoints."""

from __future__ import annotations

import torch


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [num_tokens, num_heads, head_dim] by per-token cos/sin [num_tokens, rotary_dim]."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    x1, x2 = x_rot[..., :half], x_rot[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    out = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    if x_pass.shape[-1] == 0:
        return out.to(x.dtype)
    return torch.cat((out.to(x.dtype), x_pass), dim=-1)
