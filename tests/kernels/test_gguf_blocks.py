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

# byte offsets of each block's float16 fields (ggml's block structs)
F16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,),
}  # fmt: skip


def random_blocks(type_name: str, num_rows: int, num_blocks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size = gguf_blocks.BLOCKS[type_name][1]
    blocks = rng.integers(0, 256, size=(num_rows * num_blocks, size), dtype=np.uint8)
    for offset in F16_FIELDS[type_name]:
        values = rng.uniform(-0.05, 0.05, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = values.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(num_rows, -1)


def reference(blocks: np.ndarray, type_name: str, num_cols: int) -> torch.Tensor:
    values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name])
    return torch.from_numpy(values.reshape(blocks.shape[0], num_cols).astype(np.float32))


@pytest.mark.parametrize("type_name", list(gguf_blocks.BLOCKS))
def test_block_sizes_are_ggmls(type_name):
    assert tuple(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]) == gguf_blocks.BLOCKS[type_name]


@pytest.mark.parametrize("type_name", list(gguf_blocks.BLOCKS))
@pytest.mark.parametrize(("num_rows", "num_blocks"), [(1, 1), (3, 2), (7, 3)])
def test_dequantize_equals_ggufs_to_the_bit(type_name, num_rows, num_blocks):
    blocks = random_blocks(type_name, num_rows, num_blocks, seed=num_rows * 10 + num_blocks)
    num_cols = num_blocks * gguf_blocks.BLOCKS[type_name][0]
    ours = gguf_blocks.dequantize(torch.from_numpy(blocks), type_name, num_cols)
    want = reference(blocks, type_name, num_cols)
    assert ours.dtype == torch.float32 and torch.isfinite(want).all()
    assert torch.equal(ours, want), type_name


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K"])
def test_leading_dimensions_and_bfloat16(type_name):
    blocks = torch.from_numpy(random_blocks(type_name, 6, 2, seed=1)).reshape(2, 3, -1)
    num_cols = 2 * gguf_blocks.BLOCKS[type_name][0]
    flat = gguf_blocks.dequantize(blocks.reshape(6, -1), type_name, num_cols)
    assert torch.equal(gguf_blocks.dequantize(blocks, type_name, num_cols), flat.reshape(2, 3, num_cols))
    assert torch.equal(
        gguf_blocks.dequantize(blocks, type_name, num_cols, torch.bfloat16), flat.reshape(2, 3, -1).bfloat16()
    )


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_linear_is_the_product_rounded_once(type_name, dtype, rows):
    num_cols = 2 * gguf_blocks.BLOCKS[type_name][0]
    blocks = random_blocks(type_name, 24, 2, seed=rows)
    weight = reference(blocks, type_name, num_cols).double()
    x = torch.randn(rows, num_cols, generator=torch.Generator().manual_seed(rows)).to(dtype)
    bias = torch.randn(24).to(dtype)
    got = gguf_blocks.linear(x, torch.from_numpy(blocks), type_name, bias)
    want = x.double() @ weight.T + bias.double()
    assert got.dtype == dtype
    rtol = 2**-8 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=1e-5 * want.abs().max().item())


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ValueError, match="Q4_K row holds whole blocks of 256 values; 300 columns"):
        gguf_blocks.row_bytes("Q4_K", 300)
    with pytest.raises(ValueError, match="not a GGUF block type"):
        gguf_blocks.row_bytes("Q9_X", 256)
    with pytest.raises(ValueError, match="Q6_K rows of 256 values are 210 bytes"):
        gguf_blocks.dequantize(torch.zeros(2, 144, dtype=torch.uint8), "Q6_K", 256)
