"""Backend dispatch: candidates in order, declining with None, the torch twin last, forced reference."""

from __future__ import annotations

import torch

from kernels import dispatch, ops


def test_candidates_before_reference_and_declining_falls_through(monkeypatch):
    monkeypatch.setattr(dispatch, "_candidates", {})
    monkeypatch.setattr(dispatch, "_force_reference", False)
    calls = []
    dispatch.register("op", lambda x: calls.append("ref") or "ref", reference=True)
    dispatch.register("op", lambda x: calls.append("fast") or (None if x < 0 else "fast"))
    assert dispatch.call("op", 1) == "fast"
    assert dispatch.call("op", -1) == "ref"
    assert calls == ["fast", "fast", "ref"]


def test_force_reference_skips_other_backends(monkeypatch):
    monkeypatch.setattr(dispatch, "_candidates", {})
    monkeypatch.setattr(dispatch, "_force_reference", None)
    monkeypatch.setenv("TANDEM_FORCE_REFERENCE", "1")
    dispatch.register("op", lambda: "ref", reference=True)
    dispatch.register("op", lambda: "fast")
    assert dispatch.call("op") == "ref"


def test_rms_norm_twin_matches_the_formula():
    x, w = torch.randn(5, 16), torch.randn(16)
    out, _ = ops.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(out, w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    res = torch.randn(5, 16)
    out2, summed = ops.rms_norm(x, w, 1e-6, res)
    torch.testing.assert_close(summed, x + res)


def test_silu_and_mul_twin():
    x = torch.randn(3, 8)
    torch.testing.assert_close(ops.silu_and_mul(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:])
