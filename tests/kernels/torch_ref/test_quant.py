"""The 4-bit linear op: packing round trip, torch's CPU int4 matmul against the dequantizing twin, dispatch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import dispatch, ops
from kernels.cpu import int4 as cpu_int4
from kernels.torch_ref import quant

# (tokens, out_features N, in_features K, group size): N multiples of 16 and of 64 (two packed layouts),
# the starter's fused qkv (960) and its down projection (K 1536), every group size the kernel takes.
SHAPES = [
    (1, 16, 64, 32),
    (3, 48, 96, 32),
    (5, 64, 128, 32),
    (2, 960, 576, 32),
    (1, 576, 1536, 32),
    (4, 80, 256, 64),
    (7, 128, 256, 128),
    (2, 32, 512, 256),
]


def _random_int4(num_rows: int, num_cols: int, group_size: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (num_rows, num_cols), generator=g, dtype=torch.int32)
    scales = torch.rand(num_cols // group_size, num_rows, generator=g) * 0.1 + 0.01
    zeros = torch.randn(num_cols // group_size, num_rows, generator=g) * 0.1
    return q, torch.stack((scales, zeros), dim=-1).to(dtype)


@pytest.mark.parametrize("num_rows,num_cols", [(16, 64), (48, 320), (64, 64), (192, 128), (960, 576)])
def test_unpack_inverts_pack(num_rows, num_cols):
    q, _ = _random_int4(num_rows, num_cols, 32, torch.float32)
    packed = quant.pack_int4(q)
    assert packed.shape == (num_rows, num_cols // 2) and packed.dtype == torch.uint8
    assert torch.equal(quant.unpack_int4(packed).to(torch.int32), q)


def test_dequantize_follows_the_formula():
    q, sz = _random_int4(32, 64, 32, torch.float32)
    w = quant.dequantize_int4(quant.pack_int4(q), sz, 32, torch.float32)
    # element [n, k] = (q - 8) * scale[k // 32, n] + zero[k // 32, n]
    for n, k in [(0, 0), (5, 31), (5, 32), (31, 63)]:
        expected = (q[n, k] - 8) * sz[k // 32, n, 0] + sz[k // 32, n, 1]
        torch.testing.assert_close(w[n, k], expected)


@pytest.mark.parametrize("num_tokens,num_rows,num_cols,group_size", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_cpu_candidate_matches_twin_float32(num_tokens, num_rows, num_cols, group_size, with_bias):
    q, sz = _random_int4(num_rows, num_cols, group_size, torch.float32)
    packed = quant.pack_int4(q)
    x = torch.randn(num_tokens, num_cols, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(num_rows) if with_bias else None
    fast = quant.linear_int4_cpu(x, packed, sz, group_size, bias)
    assert fast is not None
    torch.testing.assert_close(fast, quant.linear_int4(x, packed, sz, group_size, bias), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("num_tokens,num_rows,num_cols,group_size", SHAPES[:4])
def test_cpu_candidate_bfloat16_is_close_to_float32(num_tokens, num_rows, num_cols, group_size):
    q, sz = _random_int4(num_rows, num_cols, group_size, torch.float32)
    packed = quant.pack_int4(q)
    x = torch.randn(num_tokens, num_cols, generator=torch.Generator().manual_seed(1))
    exact = quant.linear_int4(x, packed, sz, group_size)
    fast = quant.linear_int4_cpu(x.bfloat16(), packed, sz.bfloat16(), group_size)
    assert fast.dtype == torch.bfloat16
    # bfloat16 keeps 8 bits of mantissa: inputs, scales and the output each round once
    torch.testing.assert_close(fast.float(), exact, rtol=0.03, atol=0.03 * exact.abs().max().item())


def test_cpu_candidate_takes_batched_and_strided_inputs():
    q, sz = _random_int4(64, 128, 32, torch.float32)
    packed = quant.pack_int4(q)
    x = torch.randn(2, 3, 256)[..., :128]  # [2, 3, K], not contiguous
    out = quant.linear_int4_cpu(x, packed, sz, 32)
    assert out.shape == (2, 3, 64)
    torch.testing.assert_close(out, quant.linear_int4(x, packed, sz, 32), rtol=1e-5, atol=1e-4)


def test_cpu_candidate_declines_what_it_cannot_run():
    q, sz = _random_int4(64, 128, 32, torch.float32)
    packed = quant.pack_int4(q)
    x = torch.randn(2, 128)
    assert quant.linear_int4_cpu(x.bfloat16(), packed, sz, 32) is None  # scales dtype differs from x
    assert quant.linear_int4_cpu(x.double(), packed, sz.double(), 32) is None  # float64 has no kernel
    assert quant.linear_int4_cpu(x, packed, sz.repeat_interleave(2, 0), 16) is None  # group size 16
    assert quant.linear_int4_cpu(x.to("meta"), packed, sz, 32) is None  # not on the CPU
    assert quant.linear_int4_cpu(x, packed, sz, 32, torch.zeros(64, dtype=torch.bfloat16)) is None


def test_can_pack_names_the_kernel_limits():
    assert quant.can_pack(960, 576, 32)
    assert not quant.can_pack(24, 64, 32)  # rows not a multiple of 16
    assert not quant.can_pack(32, 80, 32)  # columns not a multiple of the group
    assert not quant.can_pack(32, 64, 16)  # group size the kernel lacks


def test_op_uses_the_cpu_kernel_and_forced_reference_uses_the_twin(monkeypatch):
    q, sz = _random_int4(64, 128, 32, torch.float32)
    packed = quant.pack_int4(q)
    x = torch.randn(3, 128)
    monkeypatch.setattr(dispatch, "_force_reference", False)
    assert dispatch.candidates("linear_int4") == [cpu_int4.linear_int4, quant.linear_int4_cpu, quant.linear_int4]
    assert torch.equal(ops.linear_int4(x, packed, sz, 32), quant.linear_int4_cpu(x, packed, sz, 32))  # float32 x
    monkeypatch.setattr(dispatch, "_force_reference", True)  # what TANDEM_FORCE_REFERENCE=1 sets
    assert dispatch.candidates("linear_int4") == [quant.linear_int4]
    weight = quant.dequantize_int4(packed, sz, 32, torch.float32)
    assert torch.equal(ops.linear_int4(x, packed, sz, 32), F.linear(x, weight))


@pytest.mark.parametrize("num_rows,num_cols", [(16, 64), (48, 320), (64, 64), (192, 128), (960, 576), (3072, 576)])
def test_the_row_block_unpack_agrees_with_the_learned_inverse(num_rows, num_cols):
    q, _ = _random_int4(num_rows, num_cols, 32, torch.float32, seed=3)
    packed = quant.pack_int4(q)
    flat = packed.reshape(-1)
    nibbles = torch.stack((flat & 15, flat >> 4), dim=1).reshape(-1)
    learned = nibbles[quant._unpack_index(num_rows, num_cols).long()].reshape(num_rows, num_cols)
    assert torch.equal(learned.to(torch.int32), q)
    assert torch.equal(quant.unpack_int4(packed), learned)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prompt_sized_inputs_take_the_dense_path_and_agree_with_the_int4_kernel(dtype):
    num_rows, num_cols, group = 960, 576, 32
    q, sz = _random_int4(num_rows, num_cols, group, torch.float32, seed=4)
    packed, sz = quant.pack_int4(q), sz.to(dtype)
    x = torch.randn(quant.DENSE_FROM_ROWS + 3, num_cols, generator=torch.Generator().manual_seed(5)).to(dtype)
    dense = quant.linear_int4_cpu(x, packed, sz, group)
    kernel = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)
    if quant.row_block(num_rows, num_cols):  # the dense path needs the fast unpack
        assert not torch.equal(dense, kernel)  # a different computation, so not bit-identical...
    tol = 1e-4 if dtype == torch.float32 else 0.03 * kernel.float().abs().max().item()
    torch.testing.assert_close(dense.float(), kernel.float(), rtol=1e-4, atol=tol)  # ...but the same product


def test_packing_in_row_chunks_equals_packing_at_once():
    q, _ = _random_int4(quant._PACK_ROWS + 80, 64, 32, torch.float32, seed=6)
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
    assert torch.equal(quant.pack_int4(q), whole)


@pytest.mark.parametrize("num_tokens", [3, quant.DENSE_FROM_ROWS + 1])
def test_a_second_plane_adds_its_weight_on_both_paths(num_tokens):
    q_high, sz_high = _random_int4(64, 128, 32, torch.float32, seed=7)
    q_low, sz_low = _random_int4(64, 128, 32, torch.float32, seed=8)
    high, low = quant.pack_int4(q_high), quant.pack_int4(q_low)
    x = torch.randn(num_tokens, 128, generator=torch.Generator().manual_seed(9))
    bias = torch.randn(64)
    both = quant.linear_int4_cpu(x, high, sz_high, 32, bias, (low, sz_low))
    separate = quant.linear_int4_cpu(x, high, sz_high, 32, bias) + quant.linear_int4_cpu(x, low, sz_low, 32)
    torch.testing.assert_close(both, separate, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(quant.linear_int4(x, high, sz_high, 32, bias, (low, sz_low)), both, rtol=1e-5, atol=1e-4)
    assert quant.linear_int4_cpu(x, high, sz_high, 32, None, (low, sz_low.bfloat16())) is None  # plane dtypes differ
