"""The C GGUF-block matmul (kernels/cpu/kquant.py, kquant_matmul.c) against gguf's own dequantization.

Tried: Q4_K, Q5_K, Q6_K and Q8_0 weights of random valid blocks (negative and positive d, nonzero mins, every
Q5_K and Q6_K high bit, int8 q of both signs), 1 to 131 rows (tiles of 16 with remainders, more than one chunk of weight rows), 1 to 8 blocks per
row, 3-D x, a bias. Each row's result must not depend on the rows beside it.
It must decline float32 x, other types, a wrong row size and non-contiguous blocks. On an AVX512-VNNI CPU
the kernel's 8-bit path is compared with x quantized as its twin (gguf_blocks.linear_q8) quantizes it; the
portable C path (TANDEM_CPU_KERNEL_ARCH=x86-64-v3) with x as it is.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels.cpu import kquant
from kernels.torch_ref import gguf_blocks

F16_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q8_0": tuple(range(0, 272, 34))}  # per 256 values


def random_blocks(num_rows: int, num_cols: int, type_name: str, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    size = kquant.BLOCK_BYTES[type_name]
    blocks = rng.integers(0, 256, size=(num_rows * num_cols // 256, size), dtype=np.uint8)
    for offset in F16_FIELDS[type_name]:
        values = rng.uniform(-0.02, 0.02, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = values.view(np.uint8).reshape(-1, 2)
    return torch.from_numpy(blocks.reshape(num_rows, -1))


def gguf_weight(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    qtype = gguf.GGMLQuantizationType[type_name]
    return torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), qtype)).float()


def available():
    blocks = random_blocks(64, 256, "Q4_K", 0)
    return kquant.linear(torch.ones(1, 256, dtype=torch.bfloat16), blocks, "Q4_K") is not None


pytestmark = pytest.mark.skipif(not available(), reason="needs a C compiler")


def check(got, x, weight, bias=None):
    if kquant.path() == 2:
        x = gguf_blocks.quantize_activations(x)  # the 8-bit path multiplies x as its twin quantizes it
    want = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    assert got is not None and got.dtype == torch.bfloat16 and got.shape == want.shape
    # one bf16 rounding of the output (2^-8 relative) plus float32 summation in another order
    torch.testing.assert_close(got.double(), want, rtol=2**-7, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 2, 7, 16, 17, 31, 70, 131])
def test_rows_match_ggufs_dequantization(type_name, rows):
    blocks = random_blocks(96, 512, type_name, rows)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    check(kquant.linear(x, blocks, type_name), x, gguf_weight(blocks, type_name))


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize(("num_rows", "num_cols"), [(64, 256), (130, 768), (33, 2048)])
def test_shapes(type_name, num_rows, num_cols):
    blocks = random_blocks(num_rows, num_cols, type_name, num_rows)
    x = torch.randn(2, 3, num_cols, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    bias = torch.randn(num_rows).to(torch.bfloat16)
    check(kquant.linear(x, blocks, type_name, bias), x, gguf_weight(blocks, type_name), bias)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K", "Q8_0"])
def test_each_row_is_computed_as_if_alone(type_name):
    blocks = random_blocks(128, 1024, type_name, 5)
    x = torch.randn(40, 1024, generator=torch.Generator().manual_seed(2))
    x = x.to(torch.bfloat16)
    together = kquant.linear(x, blocks, type_name)
    for row in (0, 5, 16, x.shape[0] - 1):
        assert torch.equal(kquant.linear(x[row : row + 1], blocks, type_name)[0], together[row])


def test_declines_what_it_cannot_read():
    blocks = random_blocks(64, 256, "Q4_K", 3)
    x = torch.ones(1, 256, dtype=torch.bfloat16)
    assert kquant.linear(x.float(), blocks, "Q4_K") is None  # float32 x
    assert kquant.linear(x, blocks, "Q3_K") is None  # no kernel for the type
    assert kquant.linear(x, blocks, "Q6_K") is None  # 144-byte rows are not Q6_K's 210
    assert kquant.linear(x, blocks[:, :100], "Q4_K") is None  # not a whole row of blocks
    assert kquant.linear(x, torch.cat([blocks, blocks], 1)[:, ::2], "Q4_K") is None  # not contiguous
    assert kquant.linear(torch.ones(1, 128, dtype=torch.bfloat16), blocks, "Q4_K") is None  # wrong K
    assert kquant.supports("Q4_K", "cpu", torch.bfloat16, 256) and not kquant.supports(
        "Q4_K", "cpu", torch.float32, 256
    )
    assert not kquant.supports("Q8_0", "cpu", torch.bfloat16, 576)  # x goes 256 values at a time: the starter's 576
