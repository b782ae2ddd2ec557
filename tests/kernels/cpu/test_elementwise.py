"""RMSNorm, rotary embedding and SiLU-and-multiply in C (kernels/cpu/elementwise.py) against the torch twins.

Tried: 1, 16 and 4554 rows, 3-D inputs, rows that are views of wider tensors (q inside a fused qkv
projection), odd widths, partial rotary dims, gate values of +-100, 0 and NaN. Rotary and the residual sum
must equal the twins to the bit; RMSNorm and SiLU within one or two bfloat16 roundings (the float32 sum's
order and the exp differ). float32 inputs or tables, float32 norm weights and non-unit strides are declined.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import build
from kernels.cpu import elementwise as cpu
from kernels.torch_ref import activation, norm, rope

pytestmark = pytest.mark.skipif(build.load("elementwise") is None, reason="no C compiler to build the CPU kernels")


def randn(*shape, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(torch.bfloat16)


def within_roundings(got, want, roundings=1):
    """Equal up to `roundings` bfloat16 roundings (2^-8 relative each) that went the other way."""
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=roundings * 2**-7, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 64), (16, 576), (4554, 576), (3, 5, 65)])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm(shape, with_residual):
    x, weight = randn(*shape, seed=1, scale=3), randn(shape[-1], seed=2)
    residual = randn(*shape, seed=3) if with_residual else None
    got, got_sum = cpu.rms_norm(x, weight, 1e-5, residual)
    want, want_sum = norm.rms_norm(x, weight, 1e-5, residual)
    within_roundings(got, want, 2)  # the normalized value is rounded, then its product with the weight
    assert (got != want).float().mean() < 0.01  # nearly all to the bit
    assert (got_sum is None and want_sum is None) or torch.equal(got_sum, want_sum)


def test_rms_norm_of_rows_inside_a_wider_tensor():
    wide = randn(8, 200, seed=4)
    x, weight = wide[:, 20:84], randn(64, seed=5)
    within_roundings(cpu.rms_norm(x, weight, 1e-6)[0], norm.rms_norm(x, weight, 1e-6)[0], 2)


def tables(tokens, rot, seed):
    positions = torch.randint(0, 4000, (tokens,), generator=torch.Generator().manual_seed(seed)).float()
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


@pytest.mark.parametrize(("tokens", "rot"), [(1, 64), (16, 64), (4554, 64), (7, 32)])
def test_rope_equals_the_twin_to_the_bit(tokens, rot):
    qkv = randn(tokens, 9 * 64 + 2 * 3 * 64, seed=tokens)
    q = qkv[:, : 9 * 64].view(tokens, 9, 64)  # token rows are the fused projection's rows apart
    cos, sin = tables(tokens, rot, tokens)
    assert torch.equal(cpu.apply_rope(q, cos, sin), rope.apply_rope(q, cos, sin))


@pytest.mark.parametrize("rows", [1, 16, 4554])
def test_silu_and_mul(rows):
    x = randn(rows, 2 * 1536, seed=rows, scale=4)
    x[0, :4] = torch.tensor([100.0, -100.0, 0.0, float("nan")], dtype=torch.bfloat16)
    got, want = cpu.silu_and_mul(x), activation.silu_and_mul(x)
    assert torch.isnan(got[0, 3]) and torch.isnan(want[0, 3])
    got[0, 3] = want[0, 3] = 0
    within_roundings(got, want)
    assert (got != want).float().mean() < 0.001


def test_head_norms_of_a_fused_projection_take_the_kernel_at_any_token_count():
    # Qwen3's q norm sees [tokens, heads, head_dim] inside the fused q/k/v rows: past one token its rows are not
    # evenly spaced, and each token must be normed as it would be alone
    qkv = randn(3, 4 * 64 + 2 * 2 * 64)
    q = qkv[:, : 4 * 64].view(3, 4, 64)
    weight = randn(64)
    together, _ = cpu.rms_norm(q, weight, 1e-6)
    assert together.shape == q.shape
    for token in range(3):
        alone, _ = cpu.rms_norm(q[token : token + 1], weight, 1e-6)
        assert torch.equal(together[token], alone[0])


def test_declines_what_it_does_not_handle():
    x, weight = randn(4, 64), randn(64)
    assert cpu.rms_norm(x.float(), weight.float(), 1e-5) is None
    assert cpu.rms_norm(x, weight.float(), 1e-5) is None  # a float32 weight would give float32 out
    assert cpu.rms_norm(randn(64, 4).t(), weight, 1e-5) is None  # columns, not rows
    cos, sin = tables(4, 64, 0)
    q = randn(4, 2, 64)
    assert cpu.apply_rope(q, cos.float(), sin.float()) is None
    assert cpu.apply_rope(q.float(), cos, sin) is None
    assert cpu.silu_and_mul(randn(4, 7)) is None  # no even split into gate and up
    assert cpu.silu_and_mul(randn(4, 64).float()) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_write_slots_puts_a_steps_rows_where_index_put_does(dtype):
    """The decode plan's copy of new keys into their slots, on the CPU cache's head-major memory (a permuted
    view, as engine/cache makes it), with k a view into a wider projection output as v is there."""
    cache = torch.zeros(6, 3, 8, 16, dtype=dtype).permute(0, 2, 1, 3)  # [pages, page_size, heads, dim]
    want = cache.clone()
    qkv = torch.randn(4, 5 * 3 * 16).to(dtype)
    new = qkv[:, 16:64].view(4, 3, 16)  # rows 240 values apart
    pages, offsets = torch.tensor([5, 0, 5, 2]), torch.tensor([7, 0, 6, 3])
    slots = pages * 8 + offsets  # a batch's slot mapping, pages of 8
    call = cpu.bind_write_slots(new, cache, slots)
    assert call is not None and call[0](*call[1]) == 0
    want.index_put_((pages, offsets), new)
    assert torch.equal(cache, want)
    before = cache.clone()
    for outside in (6 * 8, -1):  # past the last page, or negative: nothing is written, and the plan is told
        slots[2] = outside
        assert call[0](*call[1]) == -1 and torch.equal(cache, before)


def test_write_slots_declines_what_it_does_not_handle():
    cache = torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16)
    new, slots = torch.zeros(1, 2, 8, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int64)
    assert cpu.bind_write_slots(new.float(), cache, slots) is None  # another dtype than the cache's
    assert cpu.bind_write_slots(new, cache, slots.int()) is None  # int32 slots
    two_apart = torch.zeros(4, dtype=torch.int64)[::2]
    assert cpu.bind_write_slots(torch.zeros(2, 2, 8, dtype=torch.bfloat16), cache, two_apart) is None  # strided slots
    heads_apart = torch.zeros(2, 4, 8, 2, dtype=torch.bfloat16).transpose(2, 3)  # [2, 4, 2, 8], a head's row strided
    assert cpu.bind_write_slots(new, heads_apart, slots) is None
