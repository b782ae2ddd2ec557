"""Gated activations in plain torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x is [..., 2 * n] = [gate | up]; returns silu(gate) * up, [..., n]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
