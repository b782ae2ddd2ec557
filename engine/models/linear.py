"""A linear layer whose weight is either a float matrix or packed 4-bit integers with per-group scale and zero.

Decode on a CPU is memory-bandwidth bound, so reading half a byte per weight instead of two is most of the
speed there. The 4-bit form comes straight from a GGUF file's Q4_0 / Q4_1 blocks (see `QuantizedWeight`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernels import ops


@dataclass
class QuantizedWeight:
    """A 4-bit weight before packing: W[n, k] = (values[n, k] - 8) * scales[n, k // g] + zeros[n, k // g].

    Rows are output features, so fusing projections concatenates all three tensors on dim 0 and a row
    permutation applies to all three. `dtype` is the compute dtype the model is loaded in.
    """

    values: torch.Tensor  # [N, K] uint8 in 0..15
    scales: torch.Tensor  # [N, K / group_size] float32
    zeros: torch.Tensor  # [N, K / group_size] float32
    group_size: int
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return (self.values.shape[0], self.values.shape[1])

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> QuantizedWeight:
        """The same weight with `fn` (a reordering of dim 0) applied to the values, scales and zeros alike."""
        return QuantizedWeight(fn(self.values), fn(self.scales), fn(self.zeros), self.group_size, self.dtype)

    @staticmethod
    def cat(parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        """Stack weights with the same columns and group size along the output dimension."""
        return QuantizedWeight(
            torch.cat([p.values for p in parts]),
            torch.cat([p.scales for p in parts]),
            torch.cat([p.zeros for p in parts]),
            parts[0].group_size,
            parts[0].dtype,
        )

    def dequantize(self) -> torch.Tensor:
        """The float weight [N, K] in `dtype`, computed in float32."""
        g = self.group_size
        w = (self.values.float() - 8.0) * self.scales.repeat_interleave(g, 1) + self.zeros.repeat_interleave(g, 1)
        return w.to(self.dtype)

    def is_packable(self) -> bool:
        return ops.can_pack_int4(self.shape[0], self.shape[1], self.group_size)


class Linear(nn.Module):
    """`nn.Linear` (same parameter names and forward) that can swap its weight for a packed 4-bit one.

    After `load_quantized`, `weight` is gone and the buffers `packed` [N, K / 2] uint8 and `scales_and_zeros`
    [K / group_size, N, 2] hold the weight; `forward` then goes through `ops.linear_int4`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.group_size = 0  # 0 while the weight is float
        self.register_buffer("packed", None)  # filled by `load_quantized`
        self.register_buffer("scales_and_zeros", None)

    @property
    def is_quantized(self) -> bool:
        return self.packed is not None

    def load_quantized(self, weight: QuantizedWeight, device: torch.device | str) -> None:
        """Take `weight` packed if the int4 kernels can hold its shape, else dequantized to a float weight."""
        if not weight.is_packable():
            self.weight = nn.Parameter(weight.dequantize().to(device), requires_grad=False)
            return
        del self.weight
        scales_and_zeros = torch.stack((weight.scales.t(), weight.zeros.t()), dim=-1)  # [K / g, N, 2]
        self.register_buffer("packed", ops.pack_int4(weight.values).to(device))
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(device=device, dtype=weight.dtype).contiguous())
        self.group_size = weight.group_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return ops.linear_int4(x, self.packed, self.scales_and_zeros, self.group_size, self.bias)

    def extra_repr(self) -> str:
        kind = f"int4, group_size={self.group_size}" if self.is_quantized else "float"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, {kind}"
