"""kernels/cpu/plan.py: a plan's calls keep their arguments as ctypes values made once, and the thread count
stays the one shared value the plan sets before each run (tests/engine/models/test_decode_plan.py holds whole
planned steps to the modules' bits)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from kernels.cpu import elementwise
from kernels.cpu.plan import Plan

pytestmark = pytest.mark.skipif(elementwise._kernel("silu_and_mul_bf16") is None, reason="needs a C compiler")


def test_arguments_are_made_ctypes_values_once_and_the_thread_count_is_shared():
    plan = Plan()
    gate_up = plan.buffer(3, 128)
    gate_up.copy_(torch.randn(3, 128))
    out = plan.buffer(3, 64)
    assert plan.add(elementwise.bind_silu_and_mul(gate_up, out, plan.threads))
    ((_, args),) = plan._calls
    assert all(isinstance(a, ctypes._SimpleCData) for a in args)
    assert sum(a is plan.threads for a in args) == 1
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plan.run()
        assert plan.threads.value == 1  # read from torch at each run
    finally:
        torch.set_num_threads(before)
    gate, up = gate_up.float().chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
    assert torch.allclose(out.float(), want.float(), rtol=2**-7, atol=1e-3)
