"""Triton RMSNorm, rotary embedding and SiLU-and-multiply against their torch twins (CPU: the interpreter).

Fresh random inputs per case (seeded by the case's id); every buffer the kernels allocate starts as NaN.
Inputs are also given as the strided views the models pass (heads split out of a fused projection).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from kernels.triton import launch  # does not import triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    launch.use_interpreter()  # before triton is imported: it picks the interpreter at import
pytest.importorskip("triton", reason="triton is not installed: the Triton kernels are tested only where it is")

from engine.config.model import ModelConfig, RopeScaling  # noqa: E402
from engine.models.rope import RotaryTable, inverse_frequencies  # noqa: E402
from kernels.torch_ref import activation as twin_activation  # noqa: E402
from kernels.torch_ref import norm as twin_norm  # noqa: E402
from kernels.torch_ref import rope as twin_rope  # noqa: E402
from kernels.triton import activation, norm, rope  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Make every output buffer of the launchers start as NaN instead of whatever memory held."""
    monkeypatch.setattr(
        launch, "empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
    )


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Within `TOLERANCE[dtype]` relative to each element and to the largest magnitude (for values near 0)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    tol = TOLERANCE[dtype]
    scale = expected.float().abs().max().item()
    torch.testing.assert_close(actual.cpu().float(), expected.float(), rtol=tol, atol=tol * scale)


def generator(request) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(request.node.name.encode()))


def randn(g, *shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


# ----------------------------------------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("hidden", [64, 80, 1000, 4096])
def test_rms_norm_matches_twin(request, hidden, with_residual, dtype):
    g = generator(request)
    x, weight = randn(g, 7, hidden, dtype=dtype), randn(g, hidden, dtype=dtype)
    residual = randn(g, 7, hidden, dtype=dtype) if with_residual else None
    on_device = residual.to(DEVICE) if with_residual else None
    out, summed = norm.rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-6, on_device)
    ref_out, ref_summed = twin_norm.rms_norm(x, weight, 1e-6, residual)
    assert_close(out, ref_out, dtype)
    if with_residual:
        assert_close(summed, ref_summed, dtype)
    else:
        assert summed is None


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_per_head_on_a_fused_projection_view(request, dtype):
    """Qwen3's q/k norm: x is [tokens, heads, head_dim] cut out of a wider row, so its rows are not evenly spaced."""
    g = generator(request)
    qkv = randn(g, 5, (4 + 2 * 2) * 128, dtype=dtype)
    k = qkv[:, 4 * 128 : 6 * 128].view(5, 2, 128)
    weight = randn(g, 128, dtype=dtype)
    out, _ = norm.rms_norm(k.to(DEVICE), weight.to(DEVICE), 1e-6)
    assert_close(out, twin_norm.rms_norm(k, weight, 1e-6)[0], dtype)


def test_rms_norm_float32_weight_on_bfloat16_input(request):
    """The output dtype follows type promotion, as in the twin."""
    g = generator(request)
    x, weight = randn(g, 3, 96, dtype=torch.bfloat16), randn(g, 96)
    out, _ = norm.rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-5)
    assert_close(out, twin_norm.rms_norm(x, weight, 1e-5)[0], torch.bfloat16)


# ----------------------------------------------------------------------------------------------- rotary


def rope_tables(head_dim: int, rotary_dim: int, scaling: str, positions: torch.Tensor, dtype: torch.dtype):
    """cos/sin [tokens, rotary_dim] as the engine builds them (default or llama3-scaled frequencies)."""
    rope_scaling = RopeScaling(rope_type="llama3", factor=8.0) if scaling == "llama3" else None
    config = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=8, hidden_size=head_dim, intermediate_size=8,
        num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=rotary_dim,
        rope_theta=500000.0, rope_scaling=rope_scaling,
    )  # fmt: skip
    return RotaryTable(inverse_frequencies(config)).lookup(positions, int(positions.max()) + 1, dtype)


def check_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> None:
    out = rope.apply_rope(x.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE))
    assert_close(out, twin_rope.apply_rope(x, cos, sin), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scaling", ["default", "llama3"])
@pytest.mark.parametrize("rotary_fraction", [1.0, 0.5, 0.25], ids=["full", "half", "quarter"])
@pytest.mark.parametrize("head_dim", [64, 80, 128, 256])
def test_rope_matches_twin(request, head_dim, rotary_fraction, scaling, dtype):
    """Partial rotary (Phi, StableLM, GLM) rotates the first rotary_dim of each head and passes the rest."""
    g = generator(request)
    rotary_dim = int(head_dim * rotary_fraction) // 2 * 2
    positions = torch.randint(0, 9000, (6,), generator=g)  # beyond llama3's original context as well
    cos, sin = rope_tables(head_dim, rotary_dim, scaling, positions, dtype)
    # q as the model hands it over: 5 heads out of a fused q/k/v row.
    qkv = randn(g, 6, 9 * head_dim, dtype=dtype)
    check_rope(qkv[:, : 5 * head_dim].view(6, 5, head_dim), cos, sin, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_with_arbitrary_tables(request, dtype):
    """The op takes any per-token cos/sin; here the two halves of each row differ, unlike the usual tables."""
    g = generator(request)
    cos, sin = randn(g, 6, 48, dtype=dtype), randn(g, 6, 48, dtype=dtype)
    check_rope(randn(g, 6, 3, 64, dtype=dtype), cos, sin, dtype)


def test_rope_with_m_rope_tables(request):
    """M-RoPE (Qwen2-VL) only changes the table: each band of frequencies follows its own position axis
    (time, height, width). Per-token cos/sin carry that, so the kernel needs nothing more."""
    g = generator(request)
    head_dim, sections = 128, (16, 24, 24)  # frequency pairs per axis, summing to head_dim / 2
    positions = torch.randint(0, 500, (3, 7), generator=g)  # [axis, token]
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = positions[:, :, None].float() * inv_freq  # [axis, token, head_dim / 2]
    axis = torch.repeat_interleave(torch.arange(3), torch.tensor(sections))  # which axis each frequency follows
    freqs = freqs[axis, :, torch.arange(head_dim // 2)].T  # [token, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    check_rope(randn(g, 7, 4, head_dim), cos, sin, torch.float32)


# ----------------------------------------------------------------------------------------------- SiLU


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(5, 2 * 64), (3, 2 * 1000), (2, 3, 2 * 2816)], ids=str)
def test_silu_and_mul_matches_twin(request, shape, dtype):
    g = generator(request)
    x = randn(g, *shape, dtype=dtype) * 4  # well into both tails of the sigmoid
    out = activation.silu_and_mul(x.to(DEVICE))
    assert_close(out, twin_activation.silu_and_mul(x), dtype)


def test_silu_and_mul_on_a_strided_view(request):
    g = generator(request)
    wide = randn(g, 4, 3 * 256)
    x = wide[:, : 2 * 256]  # rows 768 apart, 512 used
    assert_close(activation.silu_and_mul(x.to(DEVICE)), twin_activation.silu_and_mul(x), torch.float32)
