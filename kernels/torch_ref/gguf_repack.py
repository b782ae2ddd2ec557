"""GGUF block types repacked 16 weight rows at a time ("x16"), the layout the CPU block kernels read.

In a file, each row's blocks follow one another, so a kernel that wants the same block of 16 rows side by
side (one output row per vector lane, no horizontal sums) would gather 16 scales and transpose 16 rows of
bytes for every block. Repacking does that once, at load, into a layout of the same size: for each group of
16 rows and each block column, one tile made of the blocks' fields, each field with the 16 rows interleaved:

    field        in the file, per row        in the tile
    d, m         f16                         [r][2 bytes]: 16 halves side by side
    words        n words of w bytes          [word][r][w bytes]: one 64-byte load = word i of 16 rows
    bits         n bits (fifth bits)         permuted bit by bit, so that each 64-bit mask covers 16 rows x 4
                                             values, in the order the kernel unpacks them (below)

Quants are "words" of 4 bytes (a quad: 4 values of a row in the kernel's vpdpbusd lane), scales words too.
The tables below give each type's fields in tile order, with where they sit in the file's block:

    Q4_0/IQ4_NL  d | qs[16] in 4 quads: byte (q, r, t) = byte 4q + t of row r; low nibble = value 4q + t,
                 high nibble = value 16 + 4q + t
    Q4_1         d | m | qs as Q4_0
    Q5_0/Q5_1    as Q4_0/Q4_1 with 8 masks before qs: [h][q], bit 4r + t = fifth bit of value 16h + 4q + t
    Q8_0         d | qs[32] in 8 quads (value 4q + t)
    MXFP4        e (one byte a row, [r]) | qs as Q4_0
    Q4_K         d | dmin | the 12 scale bytes as 3 words | qs[128] in 32 quads (sub-block 2c low nibbles,
                 2c + 1 high, quads 8c .. 8c + 7)
    Q5_K         as Q4_K with 64 masks before qs: [c][half][q], bit 4r + t = bit 2c + half of qh byte 4q + t
    Q6_K         d | 16 int8 scales as 16 one-byte words ([j][r]) | ql[128] in 32 quads | qh[64] in 16 quads
    Q2_K         d | dmin | 16 scale bytes as one-byte words ([j][r]) | qs[64] in 16 quads
    Q3_K         d | the 12 scale bytes as 3 words | qs[64] in 16 quads | hmask[32] in 8 quads
    IQ4_XS       d | the 2 high-scale-bit bytes as a half | the 4 low-scale-nibble bytes as one word | qs[128] in
                 32 quads (sub-block j: quads 4j .. 4j + 3, low nibbles values 4q + t, high 16 + 4q + t)

Tiles are stored [rows / 16, blocks per row * 16 * block bytes] uint8: a group's tiles one after another.
Rows must come in whole groups of 16 (every vocabulary and projection size of the supported models does).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GROUP = 16
SUFFIX = "x16"
R = -1  # the row index's place in a field's tile order


class Field(NamedTuple):
    offset: int  # first byte in the file's block
    size: int  # bytes in the file's block
    dims: tuple[int, ...]  # the field's bytes (or bits, little-endian) per row, split into these
    order: tuple[int, ...]  # the tile's order of those dims, with R for the row
    bits: bool = False


def _half(offset: int) -> Field:
    return Field(offset, 2, (2,), (R, 0))


def _words(offset: int, size: int, width: int = 4) -> Field:
    return Field(offset, size, (size // width, width), (0, R, 1))


_Q5_MASKS = (2, 4, 4), (0, 1, R, 2)  # fifth bit of value 16h + 4q + t -> [h][q][r][t]
_QK_MASKS = (8, 4, 4, 2), (2, 3, 0, R, 1)  # bit (c, half) of qh byte 4q + t -> [c][half][q][r][t]

LAYOUTS: dict[str, tuple[Field, ...]] = {
    "Q4_0": (_half(0), _words(2, 16)),
    "IQ4_NL": (_half(0), _words(2, 16)),
    "Q4_1": (_half(0), _half(2), _words(4, 16)),
    "Q5_0": (_half(0), Field(2, 4, *_Q5_MASKS, bits=True), _words(6, 16)),
    "Q5_1": (_half(0), _half(2), Field(4, 4, *_Q5_MASKS, bits=True), _words(8, 16)),
    "Q8_0": (_half(0), _words(2, 32)),
    "MXFP4": (_words(0, 1, 1), _words(1, 16)),
    "Q4_K": (_half(0), _half(2), _words(4, 12), _words(16, 128)),
    "Q5_K": (_half(0), _half(2), _words(4, 12), Field(16, 32, *_QK_MASKS, bits=True), _words(48, 128)),
    "Q6_K": (_half(208), _words(192, 16, 1), _words(0, 128), _words(128, 64)),
    "Q2_K": (_half(80), _half(82), _words(0, 16, 1), _words(16, 64)),
    "Q3_K": (_half(108), _words(96, 12), _words(32, 64), _words(0, 32)),
    "IQ4_XS": (_half(0), _half(2), _words(4, 4), _words(8, 128)),
}


def repacked_name(type_name: str) -> str:
    return type_name + SUFFIX


def base_name(type_name: str) -> str:
    """The file's type of a repacked type name ("Q4_0x16" -> "Q4_0"); other names as they are."""
    return type_name[: -len(SUFFIX)] if type_name.endswith(SUFFIX) else type_name


def can_repack(type_name: str, num_rows: int) -> bool:
    return type_name in LAYOUTS and num_rows % GROUP == 0 and num_rows > 0


def block_bytes(type_name: str) -> int:
    return sum(f.size for f in LAYOUTS[type_name])


_SHIFTS = torch.arange(8, dtype=torch.uint8)


def _to_bits(b: torch.Tensor) -> torch.Tensor:
    return ((b.unsqueeze(-1) >> _SHIFTS) & 1).flatten(-2)  # [..., n bytes * 8], little-endian


def _to_bytes(bits: torch.Tensor) -> torch.Tensor:
    return (bits.unflatten(-1, (-1, 8)) << _SHIFTS).sum(-1, dtype=torch.uint8)


def _tile_permutation(field: Field) -> tuple[int, ...]:
    """Dims of [G, B, r, *dims] in the tile's order."""
    return (0, 1, *(2 if d == R else 3 + d for d in field.order))


def repack(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """Rows of `type_name` blocks [N, row bytes] -> x16 tiles [N / 16, row bytes * 16]."""
    size = block_bytes(type_name)
    n = blocks.shape[0]
    split = blocks.reshape(n // GROUP, GROUP, -1, size).transpose(1, 2)  # [G, B, 16 rows, block bytes]
    pieces = []
    for f in LAYOUTS[type_name]:
        x = split[..., f.offset : f.offset + f.size]
        x = (_to_bits(x) if f.bits else x).unflatten(-1, f.dims).permute(_tile_permutation(f)).flatten(2)
        pieces.append(_to_bytes(x) if f.bits else x)
    return torch.cat(pieces, -1).reshape(n // GROUP, -1).contiguous()


def unrepack(tiles: torch.Tensor, type_name: str) -> torch.Tensor:
    """x16 tiles [N / 16, row bytes * 16] -> the file's rows of blocks [N, row bytes]."""
    size = block_bytes(type_name)
    g = tiles.shape[0]
    t = tiles.reshape(g, -1, GROUP * size)  # [G, B, tile]
    rows = torch.empty(g, t.shape[1], GROUP, size, dtype=torch.uint8, device=tiles.device)
    start = 0
    for f in LAYOUTS[type_name]:
        x = t[..., start : start + GROUP * f.size]
        start += GROUP * f.size
        permutation = _tile_permutation(f)
        sizes = [GROUP if d == R else f.dims[d] for d in f.order]
        x = (_to_bits(x) if f.bits else x).unflatten(-1, sizes)
        x = x.permute([permutation.index(i) for i in range(len(permutation))]).flatten(3)  # [G, B, 16, bytes]
        rows[..., f.offset : f.offset + f.size] = _to_bytes(x) if f.bits else x
    return rows.transpose(1, 2).reshape(g * GROUP, -1)


def rows(tiles: torch.Tensor, type_name: str, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of x16 tiles as the file's blocks [len(ids), row bytes], unpacking only their groups."""
    ids = ids.reshape(-1).long()
    groups = unrepack(tiles[ids // GROUP].reshape(-1, tiles.shape[1]), type_name)  # [len(ids) * 16, row bytes]
    return groups.reshape(ids.shape[0], GROUP, -1)[torch.arange(ids.shape[0]), ids % GROUP]
