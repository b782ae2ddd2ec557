"""The Triton GGUF-block matmul (kernels/triton/gguf_matmul.py) against gguf's own dequantization, on a GPU where
there is one, else on the CPU in triton's interpreter.

Tried: every type, random valid blocks (negative and positive d and m, every fifth and high bit, every Q2_K/Q3_K
scale and min, every IQ4_XS scale, int8 q of both signs, all 16 IQ4_NL levels) through both forms of the kernel:
the GEMV form (1 row, and 3 rows padded to 4) and tl.dot (11, 17 and 70 rows: 16-, 64- and 128-row tiles, all
partial). 24 and 70 output features (partial column tiles), rows of 1 to 3 super-blocks and odd 32-value block
counts (96, 160 values: a K step that ends inside its blocks), float32 and bfloat16 x, 3-D x, a bias, K split
into slices (a decode step's path on a GPU), and other tile settings than the default (several row tiles,
2-block steps). The dispatch candidate must decline CPU tensors, a wrong row size and non-contiguous blocks.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.triton import launch  # does not import triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    launch.use_interpreter()  # before triton is imported: it picks the interpreter at import
pytest.importorskip("triton", reason="triton is not installed: the Triton kernels are tested only where it is")

import gguf  # noqa: E402

from kernels.torch_ref import gguf_blocks  # noqa: E402
from kernels.triton import candidates as triton_kernels  # noqa: E402
from kernels.triton import gguf_matmul  # noqa: E402

TYPES = list(gguf_blocks.BLOCKS)
BLOCK32 = [t for t in TYPES if gguf_blocks.BLOCKS[t][0] == 32]


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every buffer the launcher allocates starts as NaN, so a value the kernel never wrote shows."""
    monkeypatch.setattr(
        launch, "empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
    )


def check(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """`got` against x @ weight.T (+ bias) in float64, within the rounding the kernel is allowed: float32 sums
    (K * 2^-24 of the sum of |x||w| at worst), on a GPU a bfloat16 x's weight rounded to bfloat16 for the tensor
    cores (2^-9 of each |x||w|), and one rounding of the result to x's dtype."""
    x64, w64 = x.double().cpu(), weight.double()
    want = F.linear(x64, w64, None if bias is None else bias.double().cpu())
    magnitude = F.linear(x64.abs(), w64.abs()) + (0 if bias is None else bias.double().cpu().abs())
    per_term = x.shape[-1] * 2.0**-24 + (2.0**-9 if x.dtype != torch.float32 and DEVICE == "cuda" else 0.0)
    result = 2.0**-24 if x.dtype == torch.float32 else 2.0**-8
    allowed = per_term * magnitude + result * want.abs() + 1e-30
    assert got.dtype == x.dtype and got.shape == want.shape
    error = (got.double().cpu() - want).abs()
    assert (error <= allowed).all(), (
        f"largest error {error.max():.3g}, allowed there {allowed.flatten()[error.argmax()]:.3g}"
    )


def gguf_weight(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """The weight [N, K] as gguf itself dequantizes the blocks, float32."""
    values = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType[type_name])
    return torch.from_numpy(values).float()


def inputs(type_name: str, rows: int, num_out: int, num_cols: int, dtype: torch.dtype, seed: int):
    blocks = gguf_blocks.random_blocks(num_out, num_cols, type_name, seed)
    x = torch.randn(rows, num_cols, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return x.to(DEVICE), blocks.to(DEVICE), gguf_weight(blocks, type_name)


# (rows, dtype): the GEMV form at 1 row and at 3 rows of a 4-row tile, tl.dot's 16-, 64- and 128-row tiles
FORMS = [(1, torch.float32), (1, torch.bfloat16), (3, torch.bfloat16), (11, torch.float32), (17, torch.bfloat16)]
FORMS += [(70, torch.bfloat16)]


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize(("rows", "dtype"), FORMS, ids=[f"{rows}-{str(dtype)[6:]}" for rows, dtype in FORMS])
def test_matches_ggufs_dequantization(type_name, rows, dtype):
    x, blocks, weight = inputs(type_name, rows, 24, 512, dtype, rows)
    check(gguf_matmul.linear(x, blocks, type_name), x, weight)


@pytest.mark.parametrize("type_name", BLOCK32)
@pytest.mark.parametrize(("rows", "num_cols"), [(1, 160), (3, 96), (17, 160)])
def test_rows_that_end_inside_a_step(type_name, rows, num_cols):
    x, blocks, weight = inputs(type_name, rows, 70, num_cols, torch.float32, num_cols)
    check(gguf_matmul.linear(x, blocks, type_name), x, weight)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_K", "Q6_K"])
def test_three_dimensional_x_and_a_bias(type_name):
    x, blocks, weight = inputs(type_name, 6, 32, 256, torch.float32, 3)
    bias = torch.randn(32, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    got = gguf_matmul.linear(x.reshape(2, 3, 256), blocks, type_name, bias)
    assert got.shape == (2, 3, 32)
    check(got.reshape(6, 32), x, weight, bias)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_K"])
@pytest.mark.parametrize("rows", [2, 20])
def test_k_split_into_slices(type_name, rows, monkeypatch):
    """A decode step's few rows leave the GPU idle unless K is split; the slices' sums must add up."""
    monkeypatch.setattr(gguf_matmul, "_num_splits", lambda *args: 3)
    x, blocks, weight = inputs(type_name, rows, 32, 768, torch.float32, 5)
    check(gguf_matmul.linear(x, blocks, type_name), x, weight)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_K"])
@pytest.mark.parametrize("gemv", [True, False], ids=["gemv", "dot"])
def test_other_tile_settings(type_name, gemv, monkeypatch):
    """Settings a tile sweep may choose instead (.devdata/sweep2.py): here several row tiles and 2-block steps."""
    tiles = gguf_matmul.Tiles(2, 16, 2, 4, True, 8) if gemv else gguf_matmul.Tiles(16, 16, 2, 4, False, 2)
    monkeypatch.setattr(gguf_matmul, "tiles_for", lambda num_rows: tiles)
    x, blocks, weight = inputs(type_name, 5 if gemv else 40, 24, 256, torch.bfloat16, 7)
    check(gguf_matmul.linear(x, blocks, type_name), x, weight)


def test_the_dispatch_candidate_takes_only_what_the_kernel_reads():
    x, blocks, _ = inputs("Q4_K", 2, 32, 256, torch.bfloat16, 6)
    on_gpu = DEVICE == "cuda"
    assert (triton_kernels.linear_blocks(x, blocks, "Q4_K") is not None) == on_gpu
    assert triton_kernels.linear_blocks(x.cpu(), blocks.cpu(), "Q4_K") is None
    assert triton_kernels.linear_blocks(x[:, :128], blocks, "Q4_K") is None  # row size is 144, not 288 bytes
    assert triton_kernels.linear_blocks(x, blocks.t().contiguous().t(), "Q4_K") is None
    assert triton_kernels.linear_blocks(x, blocks, "Q4_Kx16") is None  # a CPU layout
    assert triton_kernels.blocks_supported("Q4_K", "cuda", torch.bfloat16, 256, 32) == triton_kernels.is_available()
    assert not triton_kernels.blocks_supported("Q4_K", "cpu", torch.bfloat16, 256, 32)
    assert not triton_kernels.blocks_supported("Q4_K", "cuda", torch.bfloat16, 128, 32)
    assert gguf_blocks.row_bytes("Q4_K", 256) == blocks.shape[1]
