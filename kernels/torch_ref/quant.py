"""4-bit weight-only linear layers: packing, the torch twin, and the CPU candidate.

A packed weight stands for W[n, k] = (q[n, k] - 8) * scale[k // g, n] + zero[k // g, n], with q in 0..15 and g
the group size; `scales_and_zeros` is [K / g, N, 2] (scale, zero) in the activation dtype. The packed bytes use
the layout of `torch.ops.aten._convert_weight_to_int4pack_for_cpu`, which depends on N and on the CPU's vector
width, so the twin never hard-codes it: it learns the inverse by packing index patterns through the same
converter (`unpack_int4`).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

# What `_weight_int4pack_mm_for_cpu` accepts (found by trying): N a multiple of 16, K of the group size.
GROUP_SIZES = (32, 64, 128, 256)
ROW_MULTIPLE = 16
_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def can_pack(num_rows: int, num_cols: int, group_size: int) -> bool:
    """Whether a [num_rows, num_cols] weight quantized in groups of `group_size` columns can be packed."""
    return group_size in GROUP_SIZES and num_rows % ROW_MULTIPLE == 0 and num_rows > 0 and num_cols % group_size == 0


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack integer weights [N, K] (values 0..15) into uint8 [N, K / 2] on the CPU; see `can_pack` for N, K."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(device="cpu", dtype=torch.int32).contiguous(), 1)


@lru_cache(maxsize=8)  # a decoder has four projection shapes; 4 bytes per weight each, reference use only
def _unpack_index(num_rows: int, num_cols: int) -> torch.Tensor:
    """For each weight n * K + k, the position of its nibble in the packed bytes (byte-major, low nibble first)."""
    flat = torch.arange(num_rows * num_cols, dtype=torch.int64).reshape(num_rows, num_cols)
    index = torch.zeros(num_rows * num_cols // 2, 2, dtype=torch.int64)  # [num_bytes, (low, high)]
    shift = 0
    while (1 << shift) < num_rows * num_cols:  # four bits of every index per pass
        packed = pack_int4((flat >> shift) & 15).reshape(-1).to(torch.int64)
        index[:, 0] |= (packed & 15) << shift
        index[:, 1] |= (packed >> 4) << shift
        shift += 4
    return index.reshape(-1).argsort().to(torch.int32)  # invert: nibble -> weight becomes weight -> nibble


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The integer weights [N, K] (uint8, 0..15) that `pack_int4` packed into `packed` [N, K / 2]."""
    num_rows, num_cols = packed.shape[0], packed.shape[1] * 2
    flat = packed.reshape(-1)
    nibbles = torch.stack((flat & 15, flat >> 4), dim=1).reshape(-1)  # [N * K] in packed order
    index = _unpack_index(num_rows, num_cols).to(device=packed.device, dtype=torch.int64)
    return nibbles[index].reshape(num_rows, num_cols)


def dequantize_int4(
    packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, dtype: torch.dtype
) -> torch.Tensor:
    """The float weight [N, K] a packed weight stands for, computed in float32 and returned as `dtype`."""
    q = unpack_int4(packed).float()
    scales = scales_and_zeros[..., 0].float().t().repeat_interleave(group_size, dim=1)  # [N, K]
    zeros = scales_and_zeros[..., 1].float().t().repeat_interleave(group_size, dim=1)
    return ((q - 8.0) * scales + zeros).to(dtype)


def linear_int4(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales_and_zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) -> [..., N]: the reference, dequantizing the whole weight on every call."""
    weight = dequantize_int4(packed, scales_and_zeros, group_size, x.dtype)
    return F.linear(x, weight, bias)


def linear_int4_cpu(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales_and_zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """torch's CPU int4 weight-only matmul, which reads the packed bytes directly; None where it cannot run."""
    if x.device.type != "cpu" or packed.device.type != "cpu" or scales_and_zeros.device.type != "cpu":
        return None
    if x.dtype not in _CPU_DTYPES or scales_and_zeros.dtype != x.dtype:
        return None
    if bias is not None and (bias.dtype != x.dtype or bias.device.type != "cpu"):
        return None
    num_cols = packed.shape[1] * 2
    if x.shape[-1] != num_cols or not can_pack(packed.shape[0], num_cols, group_size):
        return None
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.reshape(-1, num_cols).contiguous(), packed, group_size, scales_and_zeros
    )
    out = out.reshape(*x.shape[:-1], packed.shape[0])
    return out if bias is None else out + bias
