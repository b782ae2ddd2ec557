"""A linear layer whose weight is a float matrix, rows of GGUF blocks, or packed 4-bit integers with per-group
scale and zero.

Decode on a CPU is memory-bandwidth bound, so reading the file's 4.5 bits per weight instead of a bfloat16's
16 is most of the speed there. Where a CPU kernel reads a GGUF type (bfloat16 on a CPU: Q4_0 to Q8_0, IQ4_NL,
Q4_K to Q6_K), the weight keeps the file's blocks, or a repacked layout of the same size (see `BlockWeight`).
Elsewhere (CUDA, float32, row counts the block kernels do not take) Q4_0 / Q4_1 blocks become torch's 4-bit
form (see `QuantizedWeight`), and a Q8_0 weight two 4-bit planes whose sum is exactly its value (see
`SplitWeight`).
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

    @property
    def device(self) -> torch.device:
        return self.values.device

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
        return self.float32().to(self.dtype)

    def float32(self) -> torch.Tensor:
        """The weight [N, K] in float32, before any rounding to `dtype`."""
        g = self.group_size
        return (self.values.float() - 8.0) * self.scales.repeat_interleave(g, 1) + self.zeros.repeat_interleave(g, 1)

    def is_packable(self) -> bool:
        return ops.can_pack_int4(self.shape[0], self.shape[1], self.group_size)


@dataclass
class SplitWeight:
    """An 8-bit weight q * d (q in -128..127, d per group) as the sum of two 4-bit `QuantizedWeight` planes.

    Write q = 16 * hi + lo with lo = q mod 16 (0..15) and hi in -8..7. In the 4-bit formula (v - 8) * scale + zero,
    the high plane is v = hi + 8, scale 16d, zero 0 (giving 16d * hi) and the low plane v = lo, scale d, zero 8d
    (giving d * lo); each runs through the int4 kernel and their sum is q * d, with no rounding of q.
    """

    high: QuantizedWeight
    low: QuantizedWeight

    @staticmethod
    def from_int8(values: torch.Tensor, scales: torch.Tensor, group_size: int, dtype: torch.dtype) -> SplitWeight:
        """From int8 values [N, K] and float32 scales [N, K / group_size]."""
        # q + 128 in 0..255 is the int8 bytes with the sign bit flipped; as 128 is a multiple of 16, its low
        # nibble is lo and its high nibble hi + 8, which are the two planes' stored values. All in one byte.
        shifted = values.contiguous().view(torch.uint8) ^ 0x80
        zeros = torch.zeros_like(scales)
        return SplitWeight(
            QuantizedWeight(shifted >> 4, scales * 16.0, zeros, group_size, dtype),
            QuantizedWeight(shifted & 15, scales.clone(), scales * 8.0, group_size, dtype),
        )

    @property
    def shape(self) -> tuple[int, int]:
        return self.high.shape

    @property
    def group_size(self) -> int:
        return self.high.group_size

    @property
    def device(self) -> torch.device:
        return self.high.values.device

    @property
    def dtype(self) -> torch.dtype:
        return self.high.dtype

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> SplitWeight:
        return SplitWeight(self.high.map_rows(fn), self.low.map_rows(fn))

    @staticmethod
    def cat(parts: Sequence[SplitWeight]) -> SplitWeight:
        return SplitWeight(QuantizedWeight.cat([p.high for p in parts]), QuantizedWeight.cat([p.low for p in parts]))

    def dequantize(self) -> torch.Tensor:
        """The float weight [N, K] in `dtype`, summed in float32 before the one rounding."""
        return (self.high.float32() + self.low.float32()).to(self.dtype)

    def is_packable(self) -> bool:
        return self.high.is_packable()


@dataclass
class BlockWeight:
    """A weight [N, K] as rows of GGUF blocks: `parts` are (blocks, type name) stacked on the output dimension,
    one per checkpoint tensor a fused weight joins (q, k and v); their types may differ (llama.cpp's Q4_K_M
    files give some layers' v projection Q6_K beside Q4_K q and k). As read, each part is the file's bytes
    [n_i, row bytes], a view of the memory-mapped file; `packed()` gives each the layout its kernel reads
    (K-quants as they are, ggml's 32-value types repacked 16 rows at a time: "Q4_0x16", the same size)."""

    parts: list[tuple[torch.Tensor, str]]
    num_cols: int
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(ops.block_num_rows(b, t) for b, t in self.parts), self.num_cols)

    @property
    def device(self) -> torch.device:
        return self.parts[0][0].device

    @property
    def group_size(self) -> int:  # compared by fusing: every part of a fused weight is a BlockWeight
        return 0

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> BlockWeight:
        """`fn` (a device move, or a row reordering of a one-part weight before packing) applied to each part."""
        return BlockWeight([(fn(b), t) for b, t in self.parts], self.num_cols, self.dtype)

    def packed(self) -> BlockWeight:
        """Each part in the layout its kernel reads (`ops.pack_blocks`)."""
        return BlockWeight([ops.pack_blocks(b, t) for b, t in self.parts], self.num_cols, self.dtype)

    @staticmethod
    def cat(parts: Sequence[BlockWeight]) -> BlockWeight:
        """The parts stacked on the output dimension. Neighbours of one type become one tensor (rows of blocks,
        and rows of x16 tiles, stack on dim 0), so a fused projection is one kernel call per type: x quantized
        once and no concatenation of outputs (a decode step of a 1B model made 7 calls a layer, now 4 or 5)."""
        joined: list[tuple[list[torch.Tensor], str]] = []
        for blocks, type_name in (part for p in parts for part in p.parts):
            if joined and joined[-1][1] == type_name:
                joined[-1][0].append(blocks)
            else:
                joined.append(([blocks], type_name))
        return BlockWeight(
            [(run[0] if len(run) == 1 else torch.cat(run), t) for run, t in joined], parts[0].num_cols, parts[0].dtype
        )

    def dequantize(self) -> torch.Tensor:
        return torch.cat([ops.dequantize_blocks(b, t, self.num_cols, self.dtype) for b, t in self.parts])

    def is_packable(self) -> bool:
        return all(
            ops.can_keep_blocks(t, self.device, self.dtype, self.num_cols, ops.block_num_rows(b, t))
            for b, t in self.parts
        )


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
        self.register_buffer("packed_low", None)  # the second plane of a `SplitWeight`
        self.register_buffer("scales_and_zeros_low", None)
        self.block_types: list[str] = []  # a `BlockWeight`'s part types; its parts are buffers blocks0, blocks1, ...

    @property
    def is_quantized(self) -> bool:
        return self.packed is not None or bool(self.block_types)

    def load_blocks(self, weight: BlockWeight) -> None:
        """Keep `weight` in its GGUF blocks where a kernel reads them, else as a float weight."""
        if not weight.is_packable():
            self.weight = nn.Parameter(weight.dequantize(), requires_grad=False)
            return
        del self.weight
        for i, (blocks, _) in enumerate(weight.parts):
            self.register_buffer(f"blocks{i}", blocks.contiguous())
        self.block_types = [t for _, t in weight.parts]

    def load_quantized(self, weight: QuantizedWeight | SplitWeight, device: torch.device | str) -> None:
        """Take `weight` packed if the int4 kernels can hold its shape, else dequantized to a float weight."""
        if not weight.is_packable():
            self.weight = nn.Parameter(weight.dequantize().to(device), requires_grad=False)
            return
        del self.weight
        planes = (weight.high, weight.low) if isinstance(weight, SplitWeight) else (weight,)
        for i, plane in enumerate(planes):
            suffix = "" if i == 0 else "_low"
            scales_and_zeros = torch.stack((plane.scales.t(), plane.zeros.t()), dim=-1)  # [K / g, N, 2]
            self.register_buffer(f"packed{suffix}", ops.pack_int4(plane.values).to(device))
            self.register_buffer(
                f"scales_and_zeros{suffix}", scales_and_zeros.to(device=device, dtype=plane.dtype).contiguous()
            )
        self.group_size = weight.group_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.block_types:
            if len(self.block_types) == 1:
                return ops.linear_blocks(x, self.blocks0, self.block_types[0], self.bias)
            parts = [ops.linear_blocks(x, getattr(self, f"blocks{i}"), t) for i, t in enumerate(self.block_types)]
            out = torch.cat(parts, dim=-1)
            return out if self.bias is None else out + self.bias
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        low = None if self.packed_low is None else (self.packed_low, self.scales_and_zeros_low)
        return ops.linear_int4(x, self.packed, self.scales_and_zeros, self.group_size, self.bias, low)

    def tie_to(self, embeddings: torch.Tensor | BlockWeight) -> None:
        """Make this output head read the embedding matrix: as its weight when float, unless the loader gave
        it a packed form of its own (used at every row count, so a row's logits never depend on how many rows
        come with it). Embeddings kept in GGUF blocks are shared as they are (the same buffer, no copy)."""
        if isinstance(embeddings, BlockWeight):
            self.load_blocks(embeddings)
        elif not self.is_quantized:
            self.weight = embeddings

    def extra_repr(self) -> str:
        kind = f"int4, group_size={self.group_size}" if self.packed is not None else "float"
        if self.block_types:
            kind = f"GGUF blocks {'+'.join(self.block_types)}"
        if self.packed_low is not None:
            kind = f"int8 as two int4 planes, group_size={self.group_size}"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, {kind}"
