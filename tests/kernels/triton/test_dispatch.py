"""How the Triton kernels are chosen: ahead of the twins, declining what they cannot run, off when forced
to the reference, and absent without trouble when triton is not installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import dispatch, ops
from kernels.torch_ref import activation, attention, norm, rope
from kernels.triton import candidates as triton_kernels

ROOT = Path(__file__).resolve().parents[3]
OPS = {
    "write_kv": (triton_kernels.write_kv, attention.write_kv),
    "paged_attention": (triton_kernels.paged_attention, attention.paged_attention),
    "rms_norm": (triton_kernels.rms_norm, norm.rms_norm),
    "apply_rope": (triton_kernels.apply_rope, rope.apply_rope),
    "silu_and_mul": (triton_kernels.silu_and_mul, activation.silu_and_mul),
}


@pytest.mark.parametrize("op", list(OPS))
def test_triton_candidate_comes_first_and_the_twin_last(monkeypatch, op):
    monkeypatch.setattr(dispatch, "_force_reference", False)
    chain = dispatch.candidates(op)
    assert chain[0] is OPS[op][0]
    assert chain[-1] is OPS[op][1]


@pytest.mark.parametrize("op", list(OPS))
def test_force_reference_leaves_only_the_twin(monkeypatch, op):
    monkeypatch.setattr(dispatch, "_force_reference", None)  # re-read the variable on the next dispatch
    monkeypatch.setenv("TANDEM_FORCE_REFERENCE", "1")
    assert dispatch.candidates(op) == [OPS[op][1]]


def test_forced_reference_ops_still_compute(monkeypatch):
    monkeypatch.setattr(dispatch, "_force_reference", None)
    monkeypatch.setenv("TANDEM_FORCE_REFERENCE", "1")
    x, w = torch.randn(3, 32), torch.randn(32)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6)[0], norm.rms_norm(x, w, 1e-6)[0])
    torch.testing.assert_close(ops.silu_and_mul(x), activation.silu_and_mul(x))


def cpu_inputs() -> dict[str, tuple]:
    """Valid arguments for every op, on the CPU."""
    k_cache = torch.zeros(2, 16, 2, 64)
    q = torch.randn(2, 8, 64)
    tables, seq_lens = torch.tensor([[0], [1]]), torch.tensor([3, 5])
    return {
        "write_kv": (k_cache, k_cache.clone(), torch.randn(2, 2, 64), torch.randn(2, 2, 64), torch.tensor([0, 17])),
        "paged_attention": (q, k_cache, k_cache.clone(), tables, seq_lens, (1, 1), (3, 5), 0.125),
        "rms_norm": (torch.randn(4, 64), torch.ones(64), 1e-6, torch.randn(4, 64)),
        "apply_rope": (q, torch.randn(2, 64), torch.randn(2, 64)),
        "silu_and_mul": (torch.randn(4, 64),),
    }


@pytest.mark.parametrize("op", list(OPS))
def test_candidates_decline_cpu_tensors(op):
    """On the CPU the twins run, even under TRITON_INTERPRET=1 (the interpreter is for tests, and slow)."""
    assert OPS[op][0](*cpu_inputs()[op]) is None


def test_attention_shapes_supported():
    for head_dim in (64, 80, 128, 256):
        for group in (1, 4, 8):
            assert triton_kernels.attention_supports(head_dim, 2 * group, 2)
    assert not triton_kernels.attention_supports(8, 4, 2)  # below the 16-wide tile minimum
    assert not triton_kernels.attention_supports(512, 4, 2)  # wider than the kernels' registers allow
    assert not triton_kernels.attention_supports(64, 6, 4)  # query heads not a whole multiple of KV heads


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_candidates_on_cuda_accept_what_they_support_and_decline_the_rest():
    dev = "cuda"
    x, w = torch.randn(4, 64, device=dev), torch.ones(64, device=dev)
    assert triton_kernels.rms_norm(x, w, 1e-6) is not None
    assert triton_kernels.rms_norm(x.double(), w.double(), 1e-6) is None  # float64: no kernel
    q = torch.randn(2, 4, 64, device=dev)
    assert triton_kernels.apply_rope(q, torch.randn(2, 32, device=dev), torch.randn(2, 32, device=dev)) is not None
    assert triton_kernels.apply_rope(q, torch.randn(2, 31, device=dev), torch.randn(2, 31, device=dev)) is None
    cache = torch.zeros(2, 16, 2, 512, device=dev)
    args = (torch.randn(2, 4, 512, device=dev), cache, cache.clone(), torch.tensor([[0], [1]], device=dev))
    assert triton_kernels.paged_attention(*args, torch.tensor([3, 5], device=dev), (1, 1), (3, 5), 0.1) is None


@pytest.fixture
def fresh_availability():
    triton_kernels.is_available.cache_clear()
    yield
    triton_kernels.is_available.cache_clear()


def test_is_available_false_when_triton_cannot_be_imported(monkeypatch, fresh_availability):
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    assert triton_kernels.is_available() is False


WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # as if triton were not installed
import torch
from kernels import ops
from kernels.triton import candidates as triton_kernels
assert not triton_kernels.is_available()
x = torch.randn(3, 16)
ops.rms_norm(x, torch.ones(16), 1e-6, x)
ops.silu_and_mul(x)
import pytest
sys.exit(pytest.main(["-q", "-rs", "tests/kernels/triton/test_attention.py", "tests/kernels/triton/test_elementwise.py"]))
"""


def test_without_triton_the_ops_work_and_the_kernel_tests_skip_with_the_reason():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRITON], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    # Exit status 5 is pytest's "no tests collected": both modules skip whole, which is the point.
    assert run.returncode == 5, run.stdout + run.stderr
    assert "2 skipped" in run.stdout
    assert "triton is not installed" in run.stdout


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_use_interpreter_refuses_once_triton_was_imported_compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import triton\nfrom kernels.triton import launch\nlaunch.use_interpreter()"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "set TRITON_INTERPRET=1 in the environment" in run.stderr
