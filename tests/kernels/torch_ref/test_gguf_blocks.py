"""The GGUF block twin (kernels/torch_ref/gguf_blocks.py) against gguf's own dequantization, to the bit.

Tried: every type, random valid blocks (random bits with finite float16 scales of both signs, so negative d,
nonzero mins and every Q6_K/Q3_K/Q5_K high bit occur), 1 to 7 rows of 1 to 3 blocks, leading dimensions,
bfloat16 output, the linear product against a float64 reference, and rows that are not whole blocks.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from kernels.torch_ref import gguf_blocks

TYPES = list(gguf_blocks.F16_FIELDS)  # MXFP4's exponent byte: test_mxfp4.py


def random_blocks(type_name: str, num_rows: int, num_blocks: int, seed: int) -> np.ndarray:
    """[num_rows, num_blocks * bytes per block] of random bytes with small finite float16 fields of both signs."""
    rng = np.random.default_rng(seed)
    size = gguf_blocks.BLOCKS[type_name][1]
    blocks = rng.integers(0, 256, size=(num_rows * num_blocks, size), dtype=np.uint8)
    for offset in gguf_blocks.F16_FIELDS[type_name]:
        values = rng.uniform(-0.05, 0.05, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = values.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(num_rows, -1)


def reference(blocks: np.ndarray, type_name: str, num_cols: int) -> torch.Tensor:
    values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name])
    return torch.from_numpy(values.reshape(blocks.shape[0], num_cols).astype(np.float32))


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal as numbers (so -0.0 == 0.0), NaN where the other is NaN."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("type_name", TYPES)
def test_block_sizes_are_ggmls(type_name):
    assert tuple(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]) == gguf_blocks.BLOCKS[type_name]


@pytest.mark.parametrize("type_name", TYPES)
def test_float16_fields_are_where_ggml_puts_them(type_name):
    """Scaling every float16 field by 2 (an exponent bump, exact) scales every value by 2 in gguf's reference:
    the fields F16_FIELDS names are the block's only scales."""
    blocks = random_blocks(type_name, 2, 2, seed=5)
    doubled = blocks.reshape(-1, gguf_blocks.BLOCKS[type_name][1]).copy()
    for offset in gguf_blocks.F16_FIELDS[type_name]:
        field = doubled[:, offset : offset + 2].copy().view(np.float16) * np.float16(2)
        doubled[:, offset : offset + 2] = field.view(np.uint8)
    num_cols = 2 * gguf_blocks.BLOCKS[type_name][0]
    want = reference(blocks, type_name, num_cols) * 2
    assert same_values(reference(doubled.reshape(2, -1), type_name, num_cols), want)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize(("num_rows", "num_blocks"), [(1, 1), (3, 2), (7, 3)])
def test_dequantize_equals_ggufs_to_the_bit(type_name, num_rows, num_blocks):
    blocks = random_blocks(type_name, num_rows, num_blocks, seed=num_rows * 10 + num_blocks)
    num_cols = num_blocks * gguf_blocks.BLOCKS[type_name][0]
    ours = gguf_blocks.dequantize(torch.from_numpy(blocks), type_name, num_cols)
    want = reference(blocks, type_name, num_cols)
    assert ours.dtype == torch.float32 and ours.shape == (num_rows, num_cols)
    assert torch.isfinite(want).all() and want.abs().max() > 0
    assert same_values(ours, want), type_name


@pytest.mark.parametrize("type_name", TYPES)
def test_leading_dimensions_and_bfloat16(type_name):
    blocks = torch.from_numpy(random_blocks(type_name, 6, 2, seed=1)).reshape(2, 3, -1)
    num_cols = 2 * gguf_blocks.BLOCKS[type_name][0]
    flat = gguf_blocks.dequantize(blocks.reshape(6, -1), type_name, num_cols)
    shaped = gguf_blocks.dequantize(blocks, type_name, num_cols)
    assert shaped.shape == (2, 3, num_cols) and torch.equal(shaped, flat.reshape(2, 3, num_cols))
    as_bf16 = gguf_blocks.dequantize(blocks, type_name, num_cols, torch.bfloat16)
    assert as_bf16.dtype == torch.bfloat16 and torch.equal(as_bf16, shaped.bfloat16())


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 17])
@pytest.mark.parametrize("has_bias", [False, True])
def test_linear_is_the_product_rounded_once(type_name, dtype, rows, has_bias):
    num_out = 24
    num_cols = 2 * gguf_blocks.BLOCKS[type_name][0]
    blocks = random_blocks(type_name, num_out, 2, seed=rows)
    weight = reference(blocks, type_name, num_cols).double()
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, num_cols, generator=gen).to(dtype)
    bias = torch.randn(num_out, generator=gen).to(dtype) if has_bias else None
    got = gguf_blocks.linear(x, torch.from_numpy(blocks), type_name, bias)
    want = x.double() @ weight.T + (0.0 if bias is None else bias.double())  # [rows, num_out]
    assert got.dtype == dtype and got.shape == (rows, num_out)
    # float32 sums: a few float32 ulps of sum |x w| + |bias|; then one rounding to dtype (2**-9 relative in
    # bfloat16), taken relative to the row's largest output
    magnitude = (x.double().abs() @ weight.abs().T + (0.0 if bias is None else bias.double().abs())).amax(-1)
    rtol = 2**-8 if dtype == torch.bfloat16 else 2**-23
    bound = rtol * want.abs().amax(-1) + 1e-6 * magnitude + 1e-30  # [rows]
    assert ((got.double() - want).abs() <= bound[:, None]).all()


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ValueError, match="Q4_K.*column count must be a multiple of 256, got 300"):
        gguf_blocks.row_bytes("Q4_K", 300)
    with pytest.raises(ValueError, match="IQ4_NL.*column count must be a multiple of 32, got 48"):
        gguf_blocks.row_bytes("IQ4_NL", 48)
    with pytest.raises(ValueError, match="not a GGUF block type"):
        gguf_blocks.row_bytes("Q9_X", 256)
    with pytest.raises(ValueError, match="Q6_K rows of 256 values are 210 bytes"):
        gguf_blocks.dequantize(torch.zeros(2, 144, dtype=torch.uint8), "Q6_K", 256)
    assert gguf_blocks.row_bytes("Q6_K", 512) == 420 and gguf_blocks.row_bytes("Q8_0", 64) == 68
