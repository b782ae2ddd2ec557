"""Quantized KV pages (8, 6 and 4 bits) in plain torch: the format's definition, and the twin every kernel that
reads or writes it is held to.

A quantized cache layer is a uint8 tensor [num_pages, page_size, num_kv_heads, row_bytes]: each token's head row
of head_dim values is head_dim / 32 blocks, and a block is

    scale (float16, 2 bytes) | 32 codes of `bits` bits

Before quantizing, each block of 32 values is rotated by the normalized 32-point Hadamard transform (a fixed
orthogonal matrix that is its own inverse). A key or value row often has a few channels far larger than the
rest; a block's scale follows its largest value, so the small ones lose most of their bits. The rotation
spreads every channel over the whole block, and at 4 bits it halves the next-token KL divergence. Queries are
rotated the same way, so q . k is unchanged; the attention output comes out rotated and is turned back by the
same transform.

The scale is the block's value of largest magnitude over -2^(bits-1) (as ggml's q4_0), rounded to float16, so
that value maps to the code's most negative level exactly and all 2^bits levels are used; codes are
round-half-even(x / scale) clamped to [-2^(bits-1), 2^(bits-1) - 1], stored with 2^(bits-1) added:

    8 bits: 32 bytes, code i in byte i
    4 bits: 16 bytes, byte i holds code i in its low nibble and code i + 16 in its high nibble
    6 bits: the low 4 bits as the 4-bit layout (16 bytes), then 8 bytes of the top 2 bits: byte j holds those of
            codes j, j + 8, j + 16 and j + 24 at bits 0, 2, 4 and 6

Bytes per head row of 64 values (bf16: 128): 8 bits 68 (0.53x), 6 bits 52 (0.41x), 4 bits 36 (0.28x).

The rotation is written as the butterflies a C kernel runs (five stages of adds and subtracts, then one
multiply), in float32, so a kernel can match the twin's codes to the bit.
"""

from __future__ import annotations

import torch

GROUP = 32
FORMATS = {"q8": 8, "q6": 6, "q4": 4}  # the cache formats' names, as users write them, and their bits
_NORM = 0.17677669529663687  # 1 / sqrt(32)


def payload_bytes(bits: int) -> int:
    return GROUP * bits // 8


def row_bytes(head_dim: int, bits: int) -> int:
    """Bytes of one token's head row of `head_dim` values."""
    return head_dim // GROUP * (2 + payload_bytes(bits))


def bits_of(cache: torch.Tensor, head_dim: int) -> int | None:
    """The bits of a quantized cache layer (uint8 rows for heads of `head_dim`), or None for a float one."""
    if cache.dtype != torch.uint8 or head_dim % GROUP:
        return None
    per_block = cache.shape[-1] // (head_dim // GROUP) - 2
    for bits in FORMATS.values():
        if per_block == payload_bytes(bits):
            return bits
    raise ValueError(f"a uint8 cache row of {cache.shape[-1]} bytes fits no format for head_dim {head_dim}")


def rotate(x: torch.Tensor) -> torch.Tensor:
    """The normalized Hadamard transform of each block of 32 along the last axis, in float32 (its own inverse)."""
    shape = x.shape
    y = x.float().reshape(-1, GROUP)
    h = 1
    while h < GROUP:
        pairs = y.view(-1, GROUP // (2 * h), 2, h)
        a, b = pairs[:, :, 0], pairs[:, :, 1]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, GROUP)
        h *= 2
    return (y * _NORM).reshape(shape)


def quantize(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Rows x [..., head_dim] (already rotated) -> their blocks, uint8 [..., row_bytes]."""
    shape, dim = x.shape[:-1], x.shape[-1]
    blocks = x.float().reshape(-1, GROUP)
    top = 1 << (bits - 1)
    largest = blocks.gather(1, blocks.abs().argmax(dim=1, keepdim=True))  # first of ties, signed
    scale = (largest / -top).half()
    inverse = torch.where(scale == 0, 0.0, 1.0 / scale.float())
    codes = (torch.round(blocks * inverse).clamp(-top, top - 1) + top).to(torch.int32)  # [blocks, 32] 0..2^bits-1
    if bits == 8:
        payload = codes
    else:
        low = codes & 15
        payload = low[:, :16] | (low[:, 16:] << 4)
        if bits == 6:
            high = (codes >> 4).view(-1, 4, 8)  # [blocks, quarter, j]: codes j + 8 * quarter
            tops = high[:, 0] | (high[:, 1] << 2) | (high[:, 2] << 4) | (high[:, 3] << 6)
            payload = torch.cat((payload, tops), dim=1)
    scale_bytes = scale.view(torch.int16).to(torch.int32)
    head = torch.stack((scale_bytes & 255, (scale_bytes >> 8) & 255), dim=1).view(-1, 2)
    out = torch.cat((head, payload), dim=1).to(torch.uint8)
    return out.reshape(*shape, dim // GROUP * out.shape[1])


def dequantize(rows: torch.Tensor, bits: int, head_dim: int) -> torch.Tensor:
    """Blocks uint8 [..., row_bytes] -> the rotated values, float32 [..., head_dim]."""
    shape = rows.shape[:-1]
    blocks = rows.reshape(-1, 2 + payload_bytes(bits)).to(torch.int32)
    scale = (blocks[:, 0] | (blocks[:, 1] << 8)).to(torch.int16).view(torch.float16).float()
    payload = blocks[:, 2:]
    if bits == 8:
        codes = payload
    else:
        low = torch.cat((payload[:, :16] & 15, payload[:, :16] >> 4), dim=1)
        codes = low
        if bits == 6:
            tops = payload[:, 16:24]  # [blocks, 8]
            high = torch.stack([(tops >> (2 * quarter)) & 3 for quarter in range(4)], dim=1).reshape(-1, GROUP)
            codes = low | (high << 4)
    values = (codes - (1 << (bits - 1))).float() * scale[:, None]
    return values.reshape(*shape, head_dim)


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> bool:
    """Rotate, quantize and store new K/V rows [tokens, heads, head_dim] at flat slots."""
    head_dim = k.shape[-1]
    bits = bits_of(k_cache, head_dim)
    page_size = k_cache.shape[1]
    pages, offsets = slot_mapping // page_size, slot_mapping % page_size
    k_cache.index_put_((pages, offsets), quantize(rotate(k), bits))
    v_cache.index_put_((pages, offsets), quantize(rotate(v), bits))
    return True
