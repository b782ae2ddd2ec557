"""ggml's 32-value block types repacked 16 weight rows at a time ("x16"), the layout block32_matmul.c reads.

In a file, each row's blocks follow one another, so a kernel that wants the same block of 16 rows side by
side (one output row per vector lane, no horizontal sums) would gather 16 scales and transpose 16 x 16 bytes
for every block. Repacking does that once, at load, into a layout of the same size: for each group of 16 rows
and each block column, one tile

    Q4_0, IQ4_NL   d[16] (f16)                   | qs
    Q4_1           d[16], m[16]                  | qs
    Q5_0           d[16],         qh masks (64 B) | qs
    Q5_1           d[16], m[16],  qh masks (64 B) | qs
    Q8_0           d[16]                         | qs

where qs holds quad j (values 4j .. 4j + 3, four bytes) of rows 0 .. 15 as 64 consecutive bytes: byte
(j, r, t) = byte 4j + t of row r's block. For the nibble types that byte's low nibble is value 4j + t and
its high nibble value 16 + 4j + t; for Q8_0 it is value 4j + t. Q5's fifth bits become eight 64-bit masks,
[h][j]: bit 4r + t of mask (h, j) is the fifth bit of value 16h + 4j + t of row r, the bits of the 64 bytes
the kernel unpacks for that half and quad.

Tiles are stored [rows / 16, blocks per row * 16 * block bytes] uint8: a group's tiles one after another.
Rows must come in whole groups of 16 (every vocabulary and projection size of the supported models does).
"""

from __future__ import annotations

import torch

GROUP = 16
# type -> (header bytes before the fifth bits: d, or d and m; fifth-bit bytes per block; quant bytes per block)
LAYOUTS: dict[str, tuple[int, int, int]] = {
    "Q4_0": (2, 0, 16),
    "Q4_1": (4, 0, 16),
    "Q5_0": (2, 4, 16),
    "Q5_1": (4, 4, 16),
    "Q8_0": (2, 0, 32),
    "IQ4_NL": (2, 0, 16),
}
SUFFIX = "x16"


def repacked_name(type_name: str) -> str:
    return type_name + SUFFIX


def base_name(type_name: str) -> str:
    """The file's type of a repacked type name ("Q4_0x16" -> "Q4_0"); other names as they are."""
    return type_name[: -len(SUFFIX)] if type_name.endswith(SUFFIX) else type_name


def can_repack(type_name: str, num_rows: int) -> bool:
    return type_name in LAYOUTS and num_rows % GROUP == 0 and num_rows > 0


def _masks(qh: torch.Tensor) -> torch.Tensor:
    """Fifth bits qh [G, B, 16 rows, 4] (each row's little-endian u32) -> the tile's masks [G, B, 64] bytes."""
    bits = (qh.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1  # [G, B, 16, 4 bytes, 8]
    bits = bits.flatten(-2).unflatten(-1, (2, 4, 4))  # [G, B, r, h, j, t]: value 16h + 4j + t
    bits = bits.permute(0, 1, 3, 4, 2, 5).flatten(-4)  # [G, B, (h, j, r, t)] = 512 bits
    packed = bits.unflatten(-1, (64, 8)) << torch.arange(8, dtype=torch.uint8)
    return packed.sum(-1, dtype=torch.uint8)


def _unmasks(masks: torch.Tensor) -> torch.Tensor:
    """The inverse of `_masks`: [G, B, 64] -> qh [G, B, 16, 4]."""
    bits = ((masks.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).flatten(-2)  # [G, B, 512]
    bits = bits.unflatten(-1, (2, 4, 16, 4)).permute(0, 1, 4, 2, 3, 5).flatten(-3)  # [G, B, r, 32 values]
    return (bits.unflatten(-1, (4, 8)) << torch.arange(8, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)


def repack(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """Rows of `type_name` blocks [N, row bytes] -> x16 tiles [N / 16, row bytes * 16]."""
    header, high, quants = LAYOUTS[type_name]
    size = header + high + quants
    n = blocks.shape[0]
    split = blocks.reshape(n // GROUP, GROUP, -1, size).transpose(1, 2)  # [G, B, 16 rows, block bytes]
    g, b = split.shape[:2]
    fields = [split[..., i : i + 2].flatten(-2) for i in range(0, header, 2)]  # d[16], then m[16]
    if high:
        fields.append(_masks(split[..., header : header + high].contiguous()))
    qs = split[..., header + high :].unflatten(-1, (quants // 4, 4))  # [G, B, r, j, t]
    fields.append(qs.transpose(2, 3).flatten(-3))
    return torch.cat(fields, -1).reshape(g, b * GROUP * size).contiguous()


def unrepack(tiles: torch.Tensor, type_name: str) -> torch.Tensor:
    """x16 tiles [N / 16, row bytes * 16] -> the file's rows of blocks [N, row bytes]."""
    header, high, quants = LAYOUTS[type_name]
    size = header + high + quants
    g = tiles.shape[0]
    t = tiles.reshape(g, -1, GROUP * size)  # [G, B, tile]
    fields = [t[..., 2 * GROUP * i : 2 * GROUP * (i + 1)].unflatten(-1, (GROUP, 2)) for i in range(header // 2)]
    offset = header * GROUP
    if high:
        fields.append(_unmasks(t[..., offset : offset + 64].contiguous()))
        offset += 64
    qs = t[..., offset:].unflatten(-1, (quants // 4, GROUP, 4)).transpose(2, 3).flatten(-2)  # [G, B, r, bytes]
    rows = torch.cat([*fields, qs], -1)  # [G, B, 16, block bytes]
    return rows.transpose(1, 2).reshape(g * GROUP, -1)


def rows(tiles: torch.Tensor, type_name: str, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of x16 tiles as the file's blocks [len(ids), row bytes], unpacking only their groups."""
    ids = ids.reshape(-1).long()
    groups = unrepack(tiles[ids // GROUP].reshape(-1, tiles.shape[1]), type_name)  # [len(ids) * 16, row bytes]
    return groups.reshape(ids.shape[0], GROUP, -1)[torch.arange(ids.shape[0]), ids % GROUP]
