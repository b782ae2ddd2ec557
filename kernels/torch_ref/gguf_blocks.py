"""GGUF (llama.cpp) block-quantized weights in plain torch: the twin every block kernel is tested against.

A weight [N, K] is kept as its file bytes, `blocks` [N, K / values_per_block * bytes_per_block] uint8 (any
leading shape, any device). Values are computed in float32 exactly as ggml's dequantization does (the same
products and sums in the same order), so they equal `gguf.quants.dequantize` to the bit.

Block layouts (little-endian; "f16" is an IEEE half):

    Q4_0  f16 d | 16 B nibbles            value i = d * (q - 8); byte j holds values j (low) and j + 16 (high)
    Q4_1  f16 d, f16 m | 16 B nibbles     value = d * q + m
    Q5_0  f16 d | 4 B high bits | 16 B    q = nibble | bit << 4, value = d * (q - 16)
    Q5_1  f16 d, f16 m | 4 B | 16 B       value = d * q + m
    Q8_0  f16 d | 32 int8                 value = d * q
    Q4_K  f16 d, f16 dmin | 12 B 6-bit scales and mins of 8 sub-blocks of 32 | 128 B nibbles
          value = (d * scale) * q - dmin * min; bytes 32c .. 32c + 31 hold sub-block 2c (low) and 2c + 1 (high)
    Q5_K  as Q4_K, plus 32 B of fifth bits before the nibbles (bit 2c / 2c + 1 of byte l)
    Q6_K  128 B low nibbles | 64 B high 2-bit pairs | 16 int8 scales of sub-blocks of 16 | f16 d
          value = (d * scale) * (q - 32)

Types without a torch version here (Q2_K, Q3_K, IQ4_NL, IQ4_XS) go through gguf's own numpy dequantizer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
}


def row_bytes(type_name: str, num_cols: int) -> int:
    """Bytes of one row of `num_cols` values of `type_name`."""
    if type_name not in BLOCKS:
        raise ValueError(f"{type_name} is not a GGUF block type Tandem reads ({', '.join(BLOCKS)})")
    values, size = BLOCKS[type_name]
    if num_cols % values:
        raise ValueError(
            f"a {type_name} row holds whole blocks of {values} values; {num_cols} columns is not a multiple"
        )
    return num_cols // values * size


def _f16(b: torch.Tensor, offset: int) -> torch.Tensor:
    """The float16 at byte `offset` of each block [..., bytes] as float32 [..., 1]."""
    return b[..., offset : offset + 2].contiguous().view(torch.float16).float()


def _nibbles(b: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes -> [..., 2n] values 0..15: all low nibbles, then all high ones."""
    return torch.cat((b & 15, b >> 4), dim=-1)


def _q4_0(b):
    return _f16(b, 0) * (_nibbles(b[..., 2:18]).float() - 8.0)


def _q4_1(b):
    return _f16(b, 0) * _nibbles(b[..., 4:20]).float() + _f16(b, 2)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1's 4 bytes of high bits [..., 4] -> [..., 32] bits (bit i of the little-endian 32-bit word)."""
    bits = (qh.unsqueeze(-1) >> torch.arange(8, device=qh.device, dtype=torch.uint8)) & 1  # [..., 4, 8]
    return bits.flatten(-2)


def _q5_0(b):
    q = _nibbles(b[..., 6:22]) | (_fifth_bits(b[..., 2:6]) << 4)
    return _f16(b, 0) * (q.float() - 16.0)


def _q5_1(b):
    q = _nibbles(b[..., 8:24]) | (_fifth_bits(b[..., 4:8]) << 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _q8_0(b):
    return _f16(b, 0) * b[..., 2:34].contiguous().view(torch.int8).float()


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
    qh = b[..., 16:48]  # [..., 32]: bit j of byte l is the fifth bit of value l of sub-block j
    bits = (qh.unsqueeze(-2) >> torch.arange(8, device=b.device, dtype=torch.uint8).unsqueeze(-1)) & 1
    return _k_sub_blocks(b, _chunk_nibbles(b[..., 48:176]) | (bits << 4))


def _q6_k(b):
    ql, qh = b[..., 0:128].unflatten(-1, (2, 2, 32)), b[..., 128:192].unflatten(-1, (2, 32))
    # half h, quarter t: low 4 bits from nibble t // 2 of ql[h, t % 2], high 2 from bits 2t of qh[h]
    quarters = []
    for t in range(4):
        low = ql[..., t % 2, :] >> (4 * (t // 2)) & 15
        high = (qh >> (2 * t)) & 3
        quarters.append(low | (high << 4))
    q = torch.stack(quarters, dim=-2).to(torch.int16) - 32  # [..., 2, 4, 32]
    scales = b[..., 192:208].contiguous().view(torch.int8).float().unflatten(-1, (2, 4, 2, 1))
    d = _f16(b, 208).unsqueeze(-1).unsqueeze(-1).unsqueeze(-1) * scales  # [..., 2, 4, 2, 1]
    return (d * q.float().unflatten(-1, (2, 16))).flatten(-4)


_TORCH = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0}
_TORCH |= {"Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def dequantize(blocks: torch.Tensor, type_name: str, num_cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """blocks [..., row_bytes(type_name, num_cols)] uint8 -> values [..., num_cols] (float32 math, then `dtype`)."""
    size = row_bytes(type_name, num_cols)
    if blocks.dtype != torch.uint8 or blocks.shape[-1] != size:
        raise ValueError(
            f"{type_name} rows of {num_cols} values are {size} bytes, got {tuple(blocks.shape)} {blocks.dtype}"
        )
    values, block_size = BLOCKS[type_name]
    split = blocks.reshape(*blocks.shape[:-1], num_cols // values, block_size)
    if type_name in _TORCH:
        out = _TORCH[type_name](split)
    else:
        import gguf  # ggml's own numpy dequantizer for the rarer types

        array = gguf.quants.dequantize(
            split.reshape(-1, block_size).cpu().numpy(), gguf.GGMLQuantizationType[type_name]
        )
        out = torch.from_numpy(array.astype("float32", copy=False)).to(blocks.device)
    return out.reshape(*blocks.shape[:-1], num_cols).to(dtype)


def linear(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) with W = dequantize(blocks [N, row bytes]): float32 products and sums, one
    rounding to x.dtype at the end."""
    weight = dequantize(blocks, type_name, x.shape[-1])
    out = F.linear(x.float(), weight, None if bias is None else bias.float())
    return out.to(x.dtype)


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as the 8-bit K-quant kernel sees it: per 256 values, dx = max|x| / 127 and xq = round(x / dx)
    (to nearest even), returned as dx * xq in float32."""
    blocks = x.float().unflatten(-1, (-1, 256))
    dx = blocks.abs().amax(-1, keepdim=True) / 127.0
    xq = torch.where(dx > 0, torch.round(blocks / torch.where(dx > 0, dx, 1.0)), 0.0)
    return (xq * dx).flatten(-2)


def linear_q8(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`linear` with x quantized as the 8-bit kernel quantizes it: that kernel's twin."""
    weight = dequantize(blocks, type_name, x.shape[-1])
    out = F.linear(quantize_activations(x), weight, None if bias is None else bias.float())
    return out.to(x.dtype)
