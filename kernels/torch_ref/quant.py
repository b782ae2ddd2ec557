"""4-bit weight-only linear layers: packing, the torch twin, and the CPU candidate.

A packed weight stands for W[n, k] = (q[n, k] - 8) * scale[k // g, n] + zero[k // g, n], with q in 0..15 and g
the group size; `scales_and_zeros` is [K / g, N, 2] (scale, zero) in the activation dtype. The packed bytes use
the layout of `torch.ops.aten._convert_weight_to_int4pack_for_cpu`, which depends on N and on the CPU's vector
width, so the twin never hard-codes it: it learns the inverse by packing index patterns through the same
converter (`unpack_int4`). Where the layout turns out to be the row-block one this CPU uses (checked once per
shape against the converter, see `row_block`), unpacking is a reshape instead of a gather.

`_weight_int4pack_mm_for_cpu` costs about the same per row of x whatever the number of rows (it is a loop of
matrix-vector products), so for prompt-sized inputs `linear_int4_cpu` dequantizes the weight and runs one
dense matmul instead, whose cost grows far more slowly with the rows; at a few dozen rows the int4 kernel wins.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

# What `_weight_int4pack_mm_for_cpu` accepts (found by trying): N a multiple of 16, K of the group size.
GROUP_SIZES = (32, 64, 128, 256)
ROW_MULTIPLE = 16
_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# From this many rows of x on, dequantize-then-matmul beats the int4 kernel (see the module docstring).
DENSE_FROM_ROWS = 128
# Row-block widths the converter is known to use (one per CPU vector width); each is checked before use.
_ROW_BLOCKS = (64, 32, 16)


def can_pack(num_rows: int, num_cols: int, group_size: int) -> bool:
    """Whether a [num_rows, num_cols] weight quantized in groups of `group_size` columns can be packed."""
    return group_size in GROUP_SIZES and num_rows % ROW_MULTIPLE == 0 and num_rows > 0 and num_cols % group_size == 0


# Rows packed per call: the converter wants int32 input (8 times the packed size), so a large output head packed
# at once would need a transient eight times its size. A multiple of every row-block width, so chunks pack as the whole would.
_PACK_ROWS = 4096


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack integer weights [N, K] (values 0..15) into uint8 [N, K / 2] on the CPU; see `can_pack` for N, K."""
    chunks = [q[start : start + _PACK_ROWS] for start in range(0, q.shape[0], _PACK_ROWS)]
    packed = [
        torch.ops.aten._convert_weight_to_int4pack_for_cpu(c.to(device="cpu", dtype=torch.int32).contiguous(), 1)
        for c in chunks
    ]
    return packed[0] if len(packed) == 1 else torch.cat(packed)


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


def _unpack_blocks(packed: torch.Tensor, block: int) -> torch.Tensor:
    """Inverse of the row-block layout: the bytes are [N / block, K, block / 2], and byte (b, k, i) holds row
    b * block + i of column k in its low nibble and row b * block + block / 2 + i in its high nibble."""
    num_rows, num_cols = packed.shape[0], packed.shape[1] * 2
    bytes_ = packed.reshape(num_rows // block, num_cols, block // 2)
    nibbles = torch.stack((bytes_ & 15, bytes_ >> 4), dim=1)  # [N / block, 2, K, block / 2]
    return nibbles.transpose(2, 3).reshape(num_rows, num_cols)


@lru_cache(maxsize=32)
def row_block(num_rows: int, num_cols: int) -> int:
    """The row-block width the converter uses for this shape on this CPU, or 0 if it is none of the known
    ones (packing random values and comparing leaves no room for a coincidence)."""
    q = torch.randint(0, 16, (num_rows, num_cols), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    packed = pack_int4(q)
    for block in _ROW_BLOCKS:
        if num_rows % block == 0 and torch.equal(_unpack_blocks(packed, block).to(torch.int32), q):
            return block
    return 0


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The integer weights [N, K] (uint8, 0..15) that `pack_int4` packed into `packed` [N, K / 2]."""
    num_rows, num_cols = packed.shape[0], packed.shape[1] * 2
    block = row_block(num_rows, num_cols)
    if block:
        return _unpack_blocks(packed, block)
    flat = packed.reshape(-1)
    nibbles = torch.stack((flat & 15, flat >> 4), dim=1).reshape(-1)  # [N * K] in packed order
    index = _unpack_index(num_rows, num_cols).to(device=packed.device, dtype=torch.int64)
    return nibbles[index].reshape(num_rows, num_cols)


def dequantize_int4(
    packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, dtype: torch.dtype
) -> torch.Tensor:
    """The float weight [N, K] a packed weight stands for, computed in float32 and returned as `dtype`."""
    q = unpack_int4(packed)
    num_rows, num_cols = q.shape
    scales = scales_and_zeros[..., 0].float().t().contiguous()  # [N, K / g]
    offsets = (scales_and_zeros[..., 1].float().t() - 8.0 * scales).contiguous()  # (q - 8) * s + z = q * s + (z - 8 s)
    groups = q.reshape(num_rows, num_cols // group_size, group_size).float()
    weight = torch.addcmul(offsets[..., None], groups, scales[..., None])
    return weight.reshape(num_rows, num_cols).to(dtype)


def linear_int4(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales_and_zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    low: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) -> [..., N]: the reference, dequantizing the whole weight on every call.

    `low` = (packed, scales_and_zeros) of a second plane the weight is the sum with (an 8-bit weight split in
    two, see engine.models.linear.SplitWeight); the planes are summed in float32 before one rounding.
    """
    return F.linear(x, _weight(packed, scales_and_zeros, group_size, low, x.dtype), bias)


def _weight(
    packed: torch.Tensor,
    scales_and_zeros: torch.Tensor,
    group_size: int,
    low: tuple[torch.Tensor, torch.Tensor] | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    if low is None:
        return dequantize_int4(packed, scales_and_zeros, group_size, dtype)
    high = dequantize_int4(packed, scales_and_zeros, group_size, torch.float32)
    return (high + dequantize_int4(low[0], low[1], group_size, torch.float32)).to(dtype)


def linear_int4_cpu(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales_and_zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    low: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """torch's CPU int4 weight-only matmul, which reads the packed bytes directly; None where it cannot run.

    A `low` plane is a second kernel call added to the first for few rows; for prompt-sized inputs the two
    planes are dequantized, summed and multiplied once."""
    planes = [(packed, scales_and_zeros)] + ([low] if low is not None else [])
    num_cols = packed.shape[1] * 2
    for plane_packed, plane_scales in planes:
        if plane_packed.device.type != "cpu" or plane_scales.device.type != "cpu" or plane_scales.dtype != x.dtype:
            return None
        if plane_packed.shape != packed.shape or not can_pack(packed.shape[0], num_cols, group_size):
            return None
    if x.device.type != "cpu" or x.dtype not in _CPU_DTYPES or x.shape[-1] != num_cols:
        return None
    if bias is not None and (bias.dtype != x.dtype or bias.device.type != "cpu"):
        return None
    rows = x.reshape(-1, num_cols)
    if rows.shape[0] >= DENSE_FROM_ROWS and row_block(packed.shape[0], num_cols):
        return F.linear(x, _weight(packed, scales_and_zeros, group_size, low, x.dtype), bias)
    rows = rows.contiguous()
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed, group_size, scales_and_zeros)
    for plane_packed, plane_scales in planes[1:]:
        out = out + torch.ops.aten._weight_int4pack_mm_for_cpu(rows, plane_packed, group_size, plane_scales)
    out = out.reshape(*x.shape[:-1], packed.shape[0])
    return out if bias is None else out + bias
