"""GGUF (llama.cpp) block-quantized weights in plain torch: the twin every block kernel is tested against.

A weight [N, K] is kept as its file bytes, `blocks` [N, K / values_per_block * bytes_per_block] uint8 (any
leading shape, any device). Values are computed in float32 exactly as ggml's dequantization does (the same
products and sums in the same order), so they equal `gguf.quants.dequantize` to the bit. Only torch is used.

Block layouts (little-endian; "f16" is an IEEE half; "nibbles" of n bytes are all low nibbles, then all high):

    Q4_0    f16 d | 16 B nibbles                    value = d * (q - 8)
    Q4_1    f16 d, f16 m | 16 B nibbles             value = d * q + m
    Q5_0    f16 d | 4 B fifth bits | 16 B nibbles   q = nibble | bit i of the 32-bit word << 4, value = d * (q - 16)
    Q5_1    f16 d, f16 m | 4 B | 16 B               value = d * q + m
    Q8_0    f16 d | 32 int8                         value = d * q
    IQ4_NL  f16 d | 16 B nibbles                    value = d * KVALUES[q]
    MXFP4   E8M0 e | 16 B nibbles                   value = 2^(e - 128) * E2M1_DOUBLED[q] (kernels/torch_ref/mxfp4.py)

Super-blocks of 256 values, in sub-blocks of 16 (Q2_K, Q3_K, Q6_K) or 32 (the others):

    Q2_K    16 B scales (low nibble * d, high nibble * dmin) | 64 B 2-bit q | f16 d, f16 dmin
            value = (d * scale) * q - dmin * min
    Q3_K    32 B high-bit mask | 64 B 2-bit q | 12 B 6-bit scales | f16 d
            value = (d * (scale - 32)) * (q - 4 * (1 - mask bit)): a set mask bit means no offset
    Q4_K    f16 d, f16 dmin | 12 B 6-bit scales and mins of 8 sub-blocks | 128 B
            value = (d * scale) * q - dmin * min; bytes 32c .. 32c + 31 hold sub-block 2c (low) and 2c + 1 (high)
    Q5_K    as Q4_K, plus 32 B of fifth bits before the nibbles (bit j of byte l: value l of sub-block j)
    Q6_K    128 B low nibbles | 64 B high 2-bit pairs | 16 int8 scales | f16 d
            value = (d * scale) * (q - 32)
    IQ4_XS  f16 d | 2 B high scale bits (2 per sub-block) | 4 B low scale nibbles | 128 B, 16 B per sub-block
            value = (d * (scale - 32)) * KVALUES[q]

The 2-bit q of Q2_K and Q3_K: value 128h + 32s + l is bits 2s, 2s + 1 of byte 32h + l (h half, s shift):

    byte 32h + l:  [ s=3 | s=2 | s=1 | s=0 ]   bits 7..0, two bits each

Q3_K's mask puts the third bit of value 32j + l in bit j of byte l.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels.torch_ref import gguf_repack, mxfp4

# name -> (values per block, bytes per block), ggml's block structs
BLOCKS: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "IQ4_NL": (32, 18),
    "IQ4_XS": (256, 136),
    "MXFP4": (32, 17),
}

# Byte offsets of each block's float16 fields (d, and m or dmin where the type has one); any bit pattern makes
# the rest of a block valid. MXFP4's scale is an exponent byte instead (E8M0_FIELDS).
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}
# Byte offsets of each block's E8M0 exponent: any byte is valid, but most overflow a float32 weight.
E8M0_FIELDS: dict[str, tuple[int, ...]] = {"MXFP4": (0,)}

# The 16 non-uniform levels IQ4_NL and IQ4_XS index with a nibble (ggml's kvalues_iq4nl).
KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def row_bytes(type_name: str, num_cols: int) -> int:
    """Bytes of one row of `num_cols` values of `type_name`."""
    if type_name not in BLOCKS:
        raise ValueError(f"{type_name} is not a GGUF block type Tandem reads ({', '.join(BLOCKS)})")
    values, size = BLOCKS[type_name]
    if num_cols % values:
        raise ValueError(
            f"a {type_name} row holds whole blocks of {values} values: the column count must be a multiple of "
            f"{values}, got {num_cols}"
        )
    return num_cols // values * size


def _f16(b: torch.Tensor, offset: int) -> torch.Tensor:
    """The float16 at byte `offset` of each block [..., bytes] as float32 [..., 1]."""
    return b[..., offset : offset + 2].contiguous().view(torch.float16).float()


def _int8(b: torch.Tensor) -> torch.Tensor:
    """Bytes [..., n] read as int8, in float32."""
    return b.contiguous().view(torch.int8).float()


def _shifts(start: int, stop: int, step: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(start, stop, step, device=like.device, dtype=torch.uint8)


def _nibbles(b: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes -> [..., 2n] values 0..15: all low nibbles, then all high ones."""
    return torch.cat((b & 15, b >> 4), dim=-1)


def _bit_planes(b: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes -> [..., 8, n] bits: [j, l] is bit j of byte l."""
    return (b.unsqueeze(-2) >> _shifts(0, 8, 1, b).unsqueeze(-1)) & 1


def _crumbs(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K/Q3_K's 64 bytes of 2-bit values [..., 64] -> [..., 256] (see the module docstring)."""
    pairs = (qs.unflatten(-1, (2, 1, 32)) >> _shifts(0, 8, 2, qs).unsqueeze(-1)) & 3  # [..., 2, 4, 32]
    return pairs.flatten(-3)


def _levels(q: torch.Tensor) -> torch.Tensor:
    """IQ4 nibbles -> their KVALUES level, float32."""
    table = torch.tensor(KVALUES, dtype=torch.float32, device=q.device)
    return table[q.long()]


def _q4_0(b):
    return _f16(b, 0) * (_nibbles(b[..., 2:18]).float() - 8.0)


def _q4_1(b):
    return _f16(b, 0) * _nibbles(b[..., 4:20]).float() + _f16(b, 2)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1's 4 bytes of high bits [..., 4] -> [..., 32] bits (bit i of the little-endian 32-bit word)."""
    return _bit_planes(qh).transpose(-1, -2).flatten(-2)


def _q5_0(b):
    q = _nibbles(b[..., 6:22]) | (_fifth_bits(b[..., 2:6]) << 4)
    return _f16(b, 0) * (q.float() - 16.0)


def _q5_1(b):
    q = _nibbles(b[..., 8:24]) | (_fifth_bits(b[..., 4:8]) << 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _q8_0(b):
    return _f16(b, 0) * _int8(b[..., 2:34])


def _iq4_nl(b):
    return _f16(b, 0) * _levels(_nibbles(b[..., 2:18]))


def _q2_k(b):
    scales = b[..., 0:16]  # [..., 16]: low nibble scales d, high nibble scales dmin
    q = _crumbs(b[..., 16:80]).unflatten(-1, (16, 16)).float()
    dl = (_f16(b, 80) * (scales & 15).float()).unsqueeze(-1)
    ml = (_f16(b, 82) * (scales >> 4).float()).unsqueeze(-1)
    return (dl * q - ml).flatten(-2)


def _q3_k_scales(s: torch.Tensor) -> torch.Tensor:
    """Q3_K's 12 bytes [..., 12] -> 16 signed 6-bit scales [..., 16] as float32: the low four bits of scale i
    are nibble i // 8 of byte i % 8, the high two bits are bits 2 (i // 4) of byte 8 + i % 4."""
    low = torch.cat((s[..., 0:8] & 15, s[..., 0:8] >> 4), dim=-1)
    high = ((s[..., 8:12].unsqueeze(-2) >> _shifts(0, 8, 2, s).unsqueeze(-1)) & 3).flatten(-2)  # [..., 4 * 4]
    return (low | (high << 4)).float() - 32.0


def _q3_k(b):
    dl = (_f16(b, 108) * _q3_k_scales(b[..., 96:108])).unsqueeze(-1)  # [..., 16, 1]
    offset = (_bit_planes(b[..., 0:32]).flatten(-2) ^ 1) << 2  # 4 where the mask bit is clear
    q = _crumbs(b[..., 32:96]).to(torch.int16) - offset.to(torch.int16)  # -4..3
    return (dl * q.float().unflatten(-1, (16, 16))).flatten(-2)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes [..., 12] -> 6-bit scales and mins [..., 8] each."""
    low_scales, low_mins, rest = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    scales = torch.cat((low_scales & 63, (rest & 15) | ((low_scales >> 6) << 4)), dim=-1)
    mins = torch.cat((low_mins & 63, (rest >> 4) | ((low_mins >> 6) << 4)), dim=-1)
    return scales, mins


def _k_sub_blocks(b, q: torch.Tensor) -> torch.Tensor:
    """(d * scale) * q - dmin * min over 8 sub-blocks of 32; q [..., 8, 32]."""
    scales, mins = _k_scales(b[..., 4:16])
    d = (_f16(b, 0) * scales.float()).unsqueeze(-1)
    dm = (_f16(b, 2) * mins.float()).unsqueeze(-1)
    return (d * q.float() - dm).flatten(-2)


def _chunk_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K's 128 bytes -> [..., 8, 32]: sub-block 2c is chunk c's low nibbles, 2c + 1 its high ones."""
    chunks = qs.unflatten(-1, (4, 32))
    return torch.stack((chunks & 15, chunks >> 4), dim=-2).flatten(-3, -2)


def _q4_k(b):
    return _k_sub_blocks(b, _chunk_nibbles(b[..., 16:144]))


def _q5_k(b):
    return _k_sub_blocks(b, _chunk_nibbles(b[..., 48:176]) | (_bit_planes(b[..., 16:48]) << 4))


def _q6_k(b):
    ql, qh = b[..., 0:128].unflatten(-1, (2, 2, 32)), b[..., 128:192].unflatten(-1, (2, 32))
    # half h, quarter t: low 4 bits from nibble t // 2 of ql[h, t % 2], high 2 from bits 2t of qh[h]
    quarters = []
    for t in range(4):
        low = ql[..., t % 2, :] >> (4 * (t // 2)) & 15
        high = (qh >> (2 * t)) & 3
        quarters.append(low | (high << 4))
    q = torch.stack(quarters, dim=-2).to(torch.int16) - 32  # [..., 2, 4, 32]
    scales = _int8(b[..., 192:208]).unflatten(-1, (2, 4, 2, 1))
    d = _f16(b, 208).unsqueeze(-1).unsqueeze(-1).unsqueeze(-1) * scales  # [..., 2, 4, 2, 1]
    return (d * q.float().unflatten(-1, (2, 16))).flatten(-4)


def _iq4_xs(b):
    low = torch.stack((b[..., 4:8] & 15, b[..., 4:8] >> 4), dim=-1).flatten(-2)  # sub-block j: byte j // 2
    high = ((b[..., 2:4].unsqueeze(-1) >> _shifts(0, 8, 2, b)) & 3).flatten(-2)  # bits 2j of the uint16
    dl = (_f16(b, 0) * ((low | (high << 4)).float() - 32.0)).unsqueeze(-1)  # [..., 8, 1]
    return (dl * _levels(_nibbles(b[..., 8:136].unflatten(-1, (8, 16))))).flatten(-2)


_DEQUANTIZE = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl,
    "IQ4_XS": _iq4_xs,
    "MXFP4": mxfp4.dequantize_blocks,
}


def dequantize(blocks: torch.Tensor, type_name: str, num_cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """blocks [..., row_bytes(type_name, num_cols)] uint8 -> values [..., num_cols] (float32 math, then `dtype`).
    A repacked type ("Q4_0x16", kernels/torch_ref/gguf_repack.py) takes its tiles [N / 16, 16 * row bytes]."""
    if type_name.endswith(gguf_repack.SUFFIX):
        type_name = gguf_repack.base_name(type_name)
        blocks = gguf_repack.unrepack(blocks, type_name)
    size = row_bytes(type_name, num_cols)
    if blocks.dtype != torch.uint8 or blocks.shape[-1] != size:
        raise ValueError(
            f"{type_name} rows of {num_cols} values are {size} bytes, got {tuple(blocks.shape)} {blocks.dtype}"
        )
    values, block_size = BLOCKS[type_name]
    split = blocks.reshape(*blocks.shape[:-1], num_cols // values, block_size)  # [..., blocks per row, bytes]
    out = _DEQUANTIZE[type_name](split)
    return out.reshape(*blocks.shape[:-1], num_cols).to(dtype)


def random_blocks(num_rows: int, num_cols: int, type_name: str, seed: int, scale: float = 0.02) -> torch.Tensor:
    """Random but valid blocks [num_rows, row bytes] of `type_name`, for tests and benchmarks: random bits (so
    every high bit, sub-block scale, min and level occurs) with float16 fields uniform in [-scale, scale], and
    E8M0 exponents giving block scales (2^(e - 128)) of the 7 powers of two at or below `scale`."""
    generator = torch.Generator().manual_seed(seed)
    size = row_bytes(type_name, num_cols)
    values, block_size = BLOCKS[type_name]
    blocks = torch.randint(0, 256, (num_rows * num_cols // values, block_size), dtype=torch.uint8, generator=generator)
    for offset in F16_FIELDS.get(type_name, ()):
        fields = (torch.rand(blocks.shape[0], generator=generator) * 2 - 1) * scale
        blocks[:, offset : offset + 2] = fields.to(torch.float16).view(torch.uint8).reshape(-1, 2)
    top = 128 + math.floor(math.log2(scale))  # 2^(top - 128) <= scale
    for offset in E8M0_FIELDS.get(type_name, ()):
        blocks[:, offset] = torch.randint(top - 6, top + 1, (blocks.shape[0],), dtype=torch.uint8, generator=generator)
    return blocks.reshape(num_rows, size)


def linear(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) with W = dequantize(blocks [N, row bytes]): float32 products and sums, one
    rounding to x.dtype at the end."""
    weight = dequantize(blocks, type_name, x.shape[-1])
    out = F.linear(x.float(), weight, None if bias is None else bias.float())
    return out.to(x.dtype)


def quantize_activations(x: torch.Tensor, group: int = 256) -> torch.Tensor:
    """x [..., K] as the 8-bit block kernels see it: per `group` values (the weight type's block: 256 for the
    K-quants, 32 for the others), dx = max|x| / 127 and xq = round(x / dx) (to nearest even), returned as
    dx * xq in float32."""
    blocks = x.float().unflatten(-1, (-1, group))
    dx = blocks.abs().amax(-1, keepdim=True) / 127.0
    xq = torch.where(dx > 0, torch.round(blocks / torch.where(dx > 0, dx, 1.0)), 0.0)
    return (xq * dx).flatten(-2)


def linear_q8(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`linear` with x quantized per block of `type_name` as the 8-bit kernels quantize it: their twin."""
    weight = dequantize(blocks, type_name, x.shape[-1])
    xq = quantize_activations(x, BLOCKS[gguf_repack.base_name(type_name)][0])
    out = F.linear(xq, weight, None if bias is None else bias.float())
    return out.to(x.dtype)
