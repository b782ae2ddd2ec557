"""MXFP4 in plain torch (kernels/torch_ref/mxfp4.py, and through gguf_blocks): ggml's block against gguf's own
quantizer and dequantizer to the bit, and the conversion of Hugging Face's packed experts against transformers'
own dequantization.

Tried: blocks gguf's quantizer wrote, random bytes with every one of the 256 exponents (subnormal scales at 0 and
1, infinities past 252) and every code, the layout itself (which nibble holds which value, the doubled levels
and the halved scale), leading dimensions, the repacked x16 tiles, the twin's product, and Hugging Face blocks
and scales of random bytes (3-D, as gpt-oss stores its experts) and of values gguf quantized.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from kernels.torch_ref import gguf_blocks, gguf_repack, mxfp4

MXFP4 = gguf.GGMLQuantizationType.MXFP4


def ggufs(blocks: torch.Tensor) -> torch.Tensor:
    """gguf's dequantization of rows of MXFP4 blocks, float32 [rows, values]."""
    with np.errstate(over="ignore"):  # the largest exponents overflow float32, in gguf as in ggml
        return torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), MXFP4))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype == torch.float32
        and torch.equal(a.view(torch.int32), b.view(torch.int32))
    )


def test_the_type_is_ggmls():
    assert int(MXFP4) == 39 and tuple(gguf.GGML_QUANT_SIZES[MXFP4]) == gguf_blocks.BLOCKS["MXFP4"] == (32, 17)
    assert gguf_blocks.row_bytes("MXFP4", 2880) == 90 * 17  # gpt-oss's hidden size: 90 blocks


def test_the_layout():
    """One block by hand: exponent 130 scales the doubled levels by 2^(130 - 128) = 4 (E2M1's own by 8), value
    j sits in the low nibble of byte 1 + j and value j + 16 in its high nibble, and codes 8..15 are negative."""
    block = torch.zeros(17, dtype=torch.uint8)
    block[0] = 130
    block[1] = 0x1 | (0xF << 4)  # value 0: code 1 (0.5); value 16: code 15 (-6)
    block[16] = 0x7 | (0x9 << 4)  # value 15: code 7 (6); value 31: code 9 (-0.5)
    want = torch.zeros(32)
    want[0], want[16], want[15], want[31] = 4.0, -48.0, 48.0, -4.0  # 8 * 0.5, 8 * -6, 8 * 6, 8 * -0.5
    got = gguf_blocks.dequantize(block[None], "MXFP4", 32)[0]
    assert torch.equal(got, want) and torch.equal(ggufs(block[None])[0], want)


def test_every_exponent_and_code_equals_ggufs_to_the_bit():
    blocks = torch.randint(0, 256, (256, 17), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    blocks[:, 0] = torch.arange(256)  # every exponent once; random codes cover all 16 many times over
    rows = blocks.reshape(32, 8 * 17)
    assert same_bits(gguf_blocks.dequantize(rows, "MXFP4", 256), ggufs(rows))
    scales = mxfp4.e8m0_half(torch.arange(256, dtype=torch.uint8))
    assert scales[0] == 2.0**-128 and scales[1] == 2.0**-127 and scales[128] == 1.0 and scales[255] == 2.0**127


@pytest.mark.parametrize(("num_rows", "num_cols"), [(1, 32), (3, 64), (7, 2880)])
def test_blocks_ggufs_quantizer_wrote(num_rows, num_cols):
    values = np.random.default_rng(num_cols).standard_normal((num_rows, num_cols)).astype(np.float32)
    blocks = torch.from_numpy(gguf.quants.quantize(values, MXFP4))
    assert blocks.shape == (num_rows, gguf_blocks.row_bytes("MXFP4", num_cols))
    ours = gguf_blocks.dequantize(blocks, "MXFP4", num_cols)
    assert same_bits(ours, ggufs(blocks))
    assert (ours - torch.from_numpy(values)).abs().max() <= 0.5 * np.abs(values).max()  # the values, roughly


def test_random_blocks_are_finite_and_varied():
    blocks = gguf_blocks.random_blocks(16, 256, "MXFP4", seed=1)
    values = gguf_blocks.dequantize(blocks, "MXFP4", 256)
    assert torch.isfinite(values).all() and 0.05 < values.abs().max() <= 12 * 0.02
    assert len(blocks.view(-1, 17)[:, 0].unique()) == 7 and same_bits(values, ggufs(blocks))


def test_leading_dimensions_bfloat16_and_repacked_tiles():
    blocks = gguf_blocks.random_blocks(32, 96, "MXFP4", seed=2)
    flat = gguf_blocks.dequantize(blocks, "MXFP4", 96)
    assert torch.equal(gguf_blocks.dequantize(blocks.reshape(2, 16, -1), "MXFP4", 96), flat.reshape(2, 16, 96))
    assert torch.equal(gguf_blocks.dequantize(blocks, "MXFP4", 96, torch.bfloat16), flat.bfloat16())
    tiles = gguf_repack.repack(blocks, "MXFP4")
    assert tiles.shape == (2, 16 * blocks.shape[1]) and torch.equal(gguf_repack.unrepack(tiles, "MXFP4"), blocks)
    assert torch.equal(tiles[0, :16], blocks[:16, 0])  # a tile starts with its 16 rows' exponents
    assert torch.equal(gguf_blocks.dequantize(tiles, "MXFP4x16", 96), flat)
    ids = torch.tensor([31, 0, 17, 17])
    assert torch.equal(gguf_repack.rows(tiles, "MXFP4", ids), blocks[ids])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_twins_product(dtype):
    blocks = gguf_blocks.random_blocks(24, 128, "MXFP4", seed=3)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(3)).to(dtype)
    weight = ggufs(blocks).double()
    want = x.double() @ weight.T
    got = gguf_blocks.linear(x, blocks, "MXFP4")
    assert got.dtype == dtype
    rtol = 2**-8 if dtype == torch.bfloat16 else 2**-22
    assert ((got.double() - want).abs() <= rtol * want.abs().amax() + 1e-6 * (x.double().abs() @ weight.abs().T)).all()


# ------------------------------------------------------------------------------- Hugging Face's packed experts


def transformers_weight(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """transformers' dequantization of gpt-oss's experts [E, N, n_blocks, 16] -> [E, N, K]: it returns the weight
    [E, K, N] its experts multiply with (x @ W), the transpose of the rows the blocks are stored in."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)


def test_hugging_face_blocks_and_scales_become_the_same_values():
    """Random codes as 2 experts of 256 rows of 5 blocks, row r's exponent r: every exponent, the subnormal
    scales and the infinities included."""
    blocks = torch.randint(0, 256, (2, 256, 5, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    scales = torch.arange(256, dtype=torch.uint8)[None, :, None].expand(2, 256, 5).contiguous()
    rows = mxfp4.from_hf(blocks, scales)
    assert rows.shape == (2, 256, 5 * 17) and rows.dtype == torch.uint8
    want = transformers_weight(blocks, scales)
    assert torch.equal(gguf_blocks.dequantize(rows, "MXFP4", 160), want)
    assert same_bits(gguf_blocks.dequantize(rows.reshape(512, -1), "MXFP4", 160), ggufs(rows.reshape(512, -1)))


def test_the_exponent_byte_is_kept_and_only_nibbles_move():
    blocks = torch.zeros(1, 1, 1, 16, dtype=torch.uint8)
    blocks[..., 0] = 0x21  # values 0 and 1: codes 1 and 2
    blocks[..., 15] = 0x43  # values 30 and 31: codes 3 and 4
    rows = mxfp4.from_hf(blocks, torch.full((1, 1, 1), 127, dtype=torch.uint8))[0, 0]
    want = torch.zeros(17, dtype=torch.uint8)
    want[0] = 127
    want[1], want[2] = 0x01, 0x02  # values 0 and 1 in low nibbles (values 16 and 17 are code 0)
    want[15], want[16] = 0x30, 0x40  # values 30 and 31 in high nibbles (values 14 and 15 are code 0)
    assert torch.equal(rows, want)


def test_values_gguf_quantized_survive_the_round_trip_through_hugging_faces_layout():
    values = np.random.default_rng(5).standard_normal((2, 16, 64)).astype(np.float32)
    rows = torch.from_numpy(gguf.quants.quantize(values.reshape(32, 64), MXFP4)).reshape(2, 16, 2, 17)
    codes = torch.cat((rows[..., 1:] & 15, rows[..., 1:] >> 4), dim=-1)  # [2, 16, 2, 32] in value order
    hf_blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    assert torch.equal(mxfp4.from_hf(hf_blocks, rows[..., 0].contiguous()), rows.flatten(-2))
    assert torch.equal(
        transformers_weight(hf_blocks, rows[..., 0].contiguous()), ggufs(rows.reshape(32, -1)).reshape(2, 16, 64)
    )


def test_mismatched_pairs_are_refused():
    with pytest.raises(ValueError, match=r"blocks \[..., n_blocks, 16\] go with scales"):
        mxfp4.from_hf(torch.zeros(2, 3, 16, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        mxfp4.from_hf(torch.zeros(2, 3, 16, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.int32))
