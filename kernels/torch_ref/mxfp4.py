"""MXFP4, the 4-bit float format of gpt-oss's experts: ggml's block (GGUF type 39) in plain torch, and the
conversion of a Hugging Face checkpoint's packed experts to it.

A GGUF block holds 32 values in 17 bytes:

    byte 0        e: an E8M0 exponent, shared by the block
    bytes 1..16   4-bit E2M1 codes; byte 1 + j holds value j in its low nibble and value j + 16 in its high one

    value = 2^(e - 128) * E2M1_DOUBLED[code]

E2M1's levels are 0, 0.5, 1, 1.5, 2, 3, 4, 6 (code 0..7), negated for codes 8..15. ggml keeps them doubled,
as the integers below, and halves the scale instead (2^(e - 128), not the format's 2^(e - 127)), so a block is
a small-integer level times a power of two, like the integer block types. e < 2 gives a subnormal scale, built
from its bits as ggml_e8m0_to_fp32_half does; e = 255 is not read as NaN (ggml does not either).

Hugging Face's gpt-oss checkpoints keep the same codes and exponents in another order: `*_blocks` uint8
[..., n_blocks, 16] with value 2i in the low nibble of byte i and 2i + 1 in its high nibble, and `*_scales`
uint8 [..., n_blocks] read as 2^(scale - 127) times the undoubled level. The exponent byte is therefore the
same number in both; only the nibbles move (`from_hf`).
"""

from __future__ import annotations

import torch

# E2M1's 16 levels, doubled: code 8 is -0, which ggml stores as 0
E2M1_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """Exponent bytes -> 2^(e - 128) in float32, exactly (subnormal for e < 2)."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, torch.bitwise_left_shift(torch.full_like(e, 0x00200000), e), (e - 1) << 23)
    return bits.view(torch.float32)


def dequantize_blocks(b: torch.Tensor) -> torch.Tensor:
    """Blocks [..., 17] uint8 -> values [..., 32] float32: the scale times the level, one float32 product each,
    as gguf's dequantizer computes them."""
    codes = torch.cat((b[..., 1:17] & 15, b[..., 1:17] >> 4), dim=-1)  # [..., 32]: low nibbles, then high
    table = torch.tensor(E2M1_DOUBLED, dtype=torch.float32, device=b.device)
    return e8m0_half(b[..., 0:1]) * table[codes.long()]


def from_hf(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """A Hugging Face `*_blocks` [..., n_blocks, 16] and `*_scales` [..., n_blocks] pair (uint8, a weight's rows
    along the leading dims) -> the same rows as GGUF MXFP4 blocks [..., n_blocks * 17]: the same values."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales are uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks [..., n_blocks, 16] go with scales [..., n_blocks], got {tuple(blocks.shape)} and "
            f"{tuple(scales.shape)}"
        )
    codes = torch.stack((blocks & 15, blocks >> 4), dim=-1).flatten(-2)  # [..., n_blocks, 32] in value order
    packed = codes[..., :16] | (codes[..., 16:] << 4)  # GGUF: value j low, value j + 16 high
    return torch.cat((scales.unsqueeze(-1), packed), dim=-1).flatten(-2)
