"""The C GGUF-block matmuls (kernels/cpu/blocks.py: kquant_matmul.c, block32_matmul.c on weights repacked 16
rows at a time) against gguf's own dequantization of the file's blocks.

Tried: weights of random valid blocks of every type with a kernel (negative and positive d and m, every fifth
and high bit, every Q2_K/Q3_K scale and min, every IQ4_XS scale, int8 q of both signs, all 16 IQ4_NL levels), 1 to 131 rows (tiles of 16 with remainders, more
than one chunk of weight rows), rows of 1 to 8 super-blocks and, for the 32-value types, odd block counts
(32, 96, 576 values), 3-D x, a bias, x with all-zero blocks. Each row's result must not depend on the rows
beside it. They must decline float32 x, types without a kernel, a wrong row size and non-contiguous blocks.
On a CPU with AVX512-VNNI or AVX2 the 8-bit path is compared with x quantized as its twin (gguf_blocks.linear_q8)
quantizes it; the portable C path (TANDEM_CPU_KERNEL_ARCH=x86-64) with x as it is.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels.cpu import blocks as cpu_blocks
from kernels.torch_ref import gguf_blocks, gguf_repack

TYPES = list(gguf_blocks.F16_FIELDS)
BLOCK32 = [t for t in TYPES if gguf_blocks.BLOCKS[t][0] == 32]


def random_blocks(num_rows: int, num_cols: int, type_name: str, seed: int) -> torch.Tensor:
    """The file's blocks [num_rows, row bytes] of `type_name`, random but valid."""
    rng = np.random.default_rng(seed)
    values, size = gguf_blocks.BLOCKS[type_name]
    blocks = rng.integers(0, 256, size=(num_rows * num_cols // values, size), dtype=np.uint8)
    for offset in gguf_blocks.F16_FIELDS[type_name]:
        values = rng.uniform(-0.02, 0.02, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = values.view(np.uint8).reshape(-1, 2)
    return torch.from_numpy(blocks.reshape(num_rows, -1))


def gguf_weight(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    qtype = gguf.GGMLQuantizationType[type_name]
    return torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), qtype)).float()


def linear(x, blocks, type_name, bias=None):
    """The kernel on the file's blocks packed as it reads them."""
    packed, kernel_type = cpu_blocks.pack(blocks, type_name)
    return cpu_blocks.linear(x, packed, kernel_type, bias)


def available():
    return all(
        linear(torch.ones(1, 256, dtype=torch.bfloat16), random_blocks(64, 256, t, 0), t) is not None
        for t in ("Q4_K", "Q4_0")
    )


pytestmark = pytest.mark.skipif(not available(), reason="needs a C compiler")


def check(got, x, weight, type_name, bias=None):
    if cpu_blocks.path(cpu_blocks.kernel_type(type_name)) > 0:  # the 8-bit paths multiply x as their twin
        x = gguf_blocks.quantize_activations(x, gguf_blocks.BLOCKS[type_name][0])  # quantizes it
    product = F.linear(x.double(), weight.double())
    want = product if bias is None else product + bias.double()
    assert got is not None and got.dtype == torch.bfloat16 and got.shape == want.shape
    # float32 summation in another order, one bf16 rounding of the product (2^-8 relative) and, with a bias,
    # one of the sum
    allowed = 2**-7 * want.abs() + 2**-8 * product.abs() + 1e-4 * want.abs().max()
    assert ((got.double() - want).abs() <= allowed).all(), (got.double() - want).abs().max()


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 7, 16, 17, 31, 70, 131])
def test_rows_match_ggufs_dequantization(type_name, rows):
    blocks = random_blocks(96, 512, type_name, rows)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    check(linear(x, blocks, type_name), x, gguf_weight(blocks, type_name), type_name)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize(("num_rows", "num_cols"), [(64, 256), (130, 768), (33, 2048)])
def test_shapes(type_name, num_rows, num_cols):
    num_rows += -num_rows % 16  # repacked rows come in groups of 16
    blocks = random_blocks(num_rows, num_cols, type_name, num_rows)
    x = torch.randn(2, 3, num_cols, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    bias = torch.randn(num_rows).to(torch.bfloat16)
    check(linear(x, blocks, type_name, bias), x, gguf_weight(blocks, type_name), type_name, bias)


@pytest.mark.parametrize("type_name", BLOCK32)
@pytest.mark.parametrize("num_cols", [32, 96, 576, 1536])
def test_rows_of_any_whole_number_of_32_value_blocks(type_name, num_cols):
    """The starter's rows hold 576 values (18 blocks), and an odd count leaves the last pair half empty."""
    blocks = random_blocks(80, num_cols, type_name, num_cols)
    x = torch.randn(5, num_cols, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    x[1, :32] = 0  # a block of zeros quantizes to dx = 0
    check(linear(x, blocks, type_name), x, gguf_weight(blocks, type_name), type_name)


@pytest.mark.parametrize("type_name", TYPES)
def test_each_row_is_computed_as_if_alone(type_name):
    blocks = random_blocks(128, 1024, type_name, 5)
    x = torch.randn(40, 1024, generator=torch.Generator().manual_seed(2))
    x = x.to(torch.bfloat16)
    together = linear(x, blocks, type_name)
    for row in (0, 5, 16, x.shape[0] - 1):
        assert torch.equal(linear(x[row : row + 1], blocks, type_name)[0], together[row])


# Q8_0's 0x00 is a zero weight, whose products cancel only to rounding (d * 128 * sum + -128 * d * sum)
@pytest.mark.parametrize(
    ("type_name", "fill"), [(t, f) for t in TYPES for f in (0x00, 0x80, 0xFF) if (t, f) != ("Q8_0", 0x00)]
)
def test_the_largest_integer_sums_stay_exact(type_name, fill):
    """Every byte but the float16 fields at one value: each quant at its largest magnitude (0xFF: 4-bit 15 and
    5-bit 31; 0x80: Q8_0's -128; 0x00: IQ4_NL's -127 level, Q6_K's -32), and x all +-1 so that every int8 of
    xq is +-127. The 8-bit paths sum vpmaddubsw pairs in int16 before widening, where an overflow would wrap."""
    blocks = random_blocks(32, 512, type_name, 11)
    f16 = set()
    for offset in gguf_blocks.F16_FIELDS[type_name]:
        f16.update((offset, offset + 1))
    quants = [i for i in range(gguf_blocks.BLOCKS[type_name][1]) if i not in f16]
    by_block = blocks.view(-1, gguf_blocks.BLOCKS[type_name][1])
    by_block[:, quants] = fill
    x = torch.ones(3, 512, dtype=torch.bfloat16)
    x[1] = -1
    x[2, 1::2] = -1
    check(linear(x, blocks, type_name), x, gguf_weight(blocks, type_name), type_name)


def test_declines_what_it_cannot_read():
    blocks = random_blocks(64, 256, "Q4_K", 3)
    x = torch.ones(1, 256, dtype=torch.bfloat16)
    assert cpu_blocks.linear(x.float(), cpu_blocks.pack(blocks, "Q4_K")[0], "Q4_Kx16") is None  # float32 x
    tiles, packed = cpu_blocks.pack(blocks, "Q4_K")
    assert cpu_blocks.linear(x, tiles, "IQ2_XXSx16") is None  # no kernel for the type
    assert cpu_blocks.linear(x, blocks, "Q4_K") is None  # the file's layout is not what the kernel reads
    assert cpu_blocks.linear(x, tiles, "Q6_Kx16") is None  # Q4_K's tiles are not Q6_K's
    assert cpu_blocks.linear(x, tiles[:, :100], packed) is None  # not a whole row of tiles
    assert cpu_blocks.linear(x, torch.cat([tiles, tiles], 1)[:, ::2], packed) is None  # not contiguous
    assert cpu_blocks.linear(torch.ones(1, 128, dtype=torch.bfloat16), tiles, packed) is None  # wrong K
    q4_0 = random_blocks(64, 256, "Q4_0", 3)
    assert cpu_blocks.linear(x, q4_0, "Q4_0x16") is None  # the file's rows, not repacked tiles
    assert cpu_blocks.supports("Q4_K", "cpu", torch.bfloat16, 256, 64)
    assert not cpu_blocks.supports("Q4_K", "cpu", torch.float32, 256, 64)
    assert not cpu_blocks.supports("Q4_K", "cpu", torch.bfloat16, 576, 64)  # K-quant rows hold whole super-blocks
    assert cpu_blocks.supports("Q8_0", "cpu", torch.bfloat16, 576, 49152)  # the starter's head: 18 blocks a row
    assert not cpu_blocks.supports("Q4_0", "cpu", torch.bfloat16, 48, 64)  # not whole blocks
    assert not cpu_blocks.supports("Q4_0", "cpu", torch.bfloat16, 64, 40)  # not whole groups of 16 rows
    assert not cpu_blocks.supports("Q6_K", "cpu", torch.bfloat16, 256, 40)
    assert not cpu_blocks.supports("IQ2_XXS", "cpu", torch.bfloat16, 256, 64)


@pytest.mark.parametrize("type_name", TYPES)
def test_repacking_keeps_every_byte(type_name):
    num_cols = gguf_blocks.BLOCKS[type_name][0] * 3
    blocks = random_blocks(48, num_cols, type_name, 7)
    tiles = gguf_repack.repack(blocks, type_name)
    assert tiles.shape == (3, blocks.numel() // 3)  # the file's size
    assert torch.equal(gguf_repack.unrepack(tiles, type_name), blocks)
    ids = torch.tensor([0, 17, 47, 5, 5])
    assert torch.equal(gguf_repack.rows(tiles, type_name, ids), blocks[ids])
    assert torch.equal(
        gguf_blocks.dequantize(tiles, gguf_repack.repacked_name(type_name), num_cols), gguf_weight(blocks, type_name)
    )
