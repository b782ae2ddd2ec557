"""The C 4-bit matmul for up to 127 rows (kernels/cpu/int4.py) against the twin's float32 dequantized product.

Tried: 1 to 127 rows (tiles of 12 with every remainder), weights of 64 to 3072 rows, groups of 32 to 256
columns, a second plane (an 8-bit weight split in two), a bias, 3-D x, a row-strided x view. Each row's
result must not depend on the rows beside it. It must decline prompt-sized inputs, float32 x, other packed
layouts and non-contiguous scales. (A whole bf16 model's batched decode step through it:
tests/engine/models/test_int4.py.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu import int4 as cpu_int4
from kernels.torch_ref import quant


def random_weight(num_rows, num_cols, group, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (num_rows, num_cols), generator=g, dtype=torch.int32)
    scales = torch.rand(num_cols // group, num_rows, generator=g) * 0.1 + 0.01
    zeros = torch.randn(num_cols // group, num_rows, generator=g) * 0.1
    return quant.pack_int4(q), torch.stack((scales, zeros), dim=-1).to(torch.bfloat16)


def available():
    packed, sz = random_weight(64, 64, 32, 0)
    return cpu_int4.linear_int4(torch.ones(2, 64, dtype=torch.bfloat16), packed, sz, 32) is not None


pytestmark = pytest.mark.skipif(not available(), reason="needs a C compiler and an AVX512-BF16 CPU")


def reference(x, packed, sz, group, bias=None, low=None):
    weight = quant._weight(packed, sz.float(), group, None if low is None else (low[0], low[1].float()), torch.float32)
    return F.linear(x.float(), weight, None if bias is None else bias.float())


def check(got, want):
    assert got is not None and got.dtype == torch.bfloat16 and got.shape == want.shape
    # one bf16 rounding of the output (2^-8 relative) plus float32 summation order
    torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=1e-3 * want.abs().max().item())


@pytest.mark.parametrize("rows", [1, 2, 3, 11, 12, 13, 16, 25, 64, 127])
def test_rows(rows):
    packed, sz = random_weight(192, 256, 32, rows)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    check(cpu_int4.linear_int4(x, packed, sz, 32), reference(x, packed, sz, 32))


@pytest.mark.parametrize(
    ("num_rows", "num_cols", "group"), [(64, 64, 64), (960, 576, 32), (576, 1536, 128), (128, 512, 256)]
)
def test_shapes_and_groups(num_rows, num_cols, group):
    packed, sz = random_weight(num_rows, num_cols, group, num_rows + group)
    x = torch.randn(16, num_cols, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    check(cpu_int4.linear_int4(x, packed, sz, group), reference(x, packed, sz, group))


def test_second_plane_bias_3d_and_strided_x():
    packed, sz = random_weight(128, 128, 32, 1)
    low = random_weight(128, 128, 32, 2)
    bias = torch.randn(128).to(torch.bfloat16)
    wide = torch.randn(2, 5, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    x = wide[..., :128]  # rows 256 elements apart
    got = cpu_int4.linear_int4(x, packed, sz, 32, bias=bias, low=low)
    check(got, reference(x, packed, sz, 32, bias=bias, low=low))


def test_a_row_gives_the_same_bits_alone_and_among_others():
    packed, sz = random_weight(960, 576, 32, 9)
    x = torch.randn(13, 576, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    together = cpu_int4.linear_int4(x, packed, sz, 32)
    for row in (0, 5, 12):
        assert torch.equal(cpu_int4.linear_int4(x[row : row + 1], packed, sz, 32)[0], together[row])


def test_agrees_with_torchs_int4_kernel():
    packed, sz = random_weight(3072, 576, 32, 5)
    x = torch.randn(16, 576, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    theirs = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, sz)
    torch.testing.assert_close(cpu_int4.linear_int4(x, packed, sz, 32), theirs, rtol=2**-7, atol=2e-3)


def decline_case(name):
    packed, sz = random_weight(64, 64, 32, 0)
    x = torch.randn(4, 64).to(torch.bfloat16)
    if name == "prompt-sized":
        return torch.randn(quant.DENSE_FROM_ROWS, 64).to(torch.bfloat16), packed, sz
    if name == "float32 x":
        return x.float(), packed, sz.float()
    if name == "32-row weight":  # packed in 32-row blocks, not the kernel's 64
        return (x,) + random_weight(32, 64, 32, 0)
    return x, packed, sz.transpose(0, 1).contiguous().transpose(0, 1)  # non-contiguous scales


@pytest.mark.parametrize("name", ["prompt-sized", "float32 x", "32-row weight", "strided scales"])
def test_declines(name):
    x, packed, sz = decline_case(name)
    assert cpu_int4.linear_int4(x, packed, sz, 32) is None
