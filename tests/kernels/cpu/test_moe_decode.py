"""moe_decode.c's two calls, as engine/models/decode_plan.py records a mixture-of-experts MLP, give the bits of
the module (engine/models/moe.py's SparseMoE): K-quant experts (Q4_K, Q6_K, gate and up of two types), MXFP4
experts with biases and gpt-oss's clamped SwiGLU, 1 to 8 rows sharing experts or not; and float experts, which
the C calls do not take, run as the module inside the plan."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.models import decode_plan
from engine.models.gpt_oss import GptOssMoE
from engine.models.linear import BlockWeight
from engine.models.moe import SparseMoE
from kernels import ops
from kernels.cpu import blocks as cpu_blocks

_SPEC = importlib.util.spec_from_file_location(
    "make_bench_model", Path(__file__).resolve().parents[3] / "tools" / "make_bench_model.py"
)
bench_model = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench_model
_SPEC.loader.exec_module(bench_model)

HIDDEN, WIDTH, EXPERTS = 256, 256, 16

pytestmark = pytest.mark.skipif(
    not cpu_blocks.supports("Q4_K", "cpu", torch.bfloat16, 256, 16) or ops.decode_plan() is None,
    reason="needs a C compiler for the kernels",
)


class ClampedMoE(SparseMoE):
    """gpt-oss's router (bias, softmax over the top k) and activation, without a model config."""

    activate = GptOssMoE.activate

    def __init__(self, top_k: int):
        super().__init__(HIDDEN, EXPERTS, top_k, WIDTH, False, router_bias=True, softmax_after_topk=True)
        self.limit, self.alpha = 7.0, 1.702


def _experts(rows: int, cols: int, type_name: str, rng: np.random.Generator) -> BlockWeight:
    """Random valid blocks of EXPERTS weights [rows, cols], expert by expert, in their kernel's layout."""
    blocks = torch.from_numpy(bench_model.random_blocks(EXPERTS * rows, cols, type_name, rng))
    return BlockWeight([(blocks, type_name)], cols, torch.bfloat16).packed()


def _moe(gate: str, up: str, down: str, top_k: int, biased: bool, seed: int = 0) -> SparseMoE:
    rng, g = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    moe = ClampedMoE(top_k) if biased else SparseMoE(HIDDEN, EXPERTS, top_k, WIDTH, norm_topk_prob=True)
    with torch.no_grad():
        moe.gate.weight.copy_(torch.randn(EXPERTS, HIDDEN, generator=g) * 0.2)
        if biased:
            moe.gate.bias.copy_(torch.randn(EXPERTS, generator=g))
    parts = [_experts(WIDTH, HIDDEN, gate, rng), _experts(WIDTH, HIDDEN, up, rng)]
    moe.experts_gate_up.load(parts, "gate_up")
    moe.experts_down.load([_experts(HIDDEN, WIDTH, down, rng)], "down")
    if biased:
        bias = [torch.randn(EXPERTS, n, generator=g).to(torch.bfloat16) for n in (WIDTH, WIDTH)]
        moe.experts_gate_up.load_bias(bias, "gate_up")
        moe.experts_down.load_bias([torch.randn(EXPERTS, HIDDEN, generator=g).to(torch.bfloat16)], "down")
    return moe


def _planned(moe: SparseMoE, x: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    plan = ops.decode_plan()
    inputs = plan.buffer(*x.shape)
    out = decode_plan._record_moe(plan, moe, inputs)
    inputs.copy_(x)
    plan.run()
    return out, [getattr(fn, "__name__", "") for fn, _ in plan._calls]


CASES = {
    "q4_k-q6_k": ("Q4_K", "Q4_K", "Q6_K", 4, False),  # gate and up joined: one run of blocks
    "two-types": ("Q4_K", "Q6_K", "Q4_K", 2, False),  # gate_up as two runs of blocks, each its own call
    "mxfp4-biased": ("MXFP4", "MXFP4", "MXFP4", 4, True),
    "q8_0-top1": ("Q8_0", "Q8_0", "Q8_0", 1, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_the_planned_experts_give_the_modules_bits(case, rows):
    gate, up, down, top_k, biased = CASES[case]
    moe = _moe(gate, up, down, top_k, biased, seed=rows)
    g = torch.Generator().manual_seed(10 + rows)
    for step in range(3):
        x = (torch.randn(rows, HIDDEN, generator=g) * 2).to(torch.bfloat16)
        if rows > 2:
            x[1] = x[0]  # two rows on the same experts
        got, names = _planned(moe, x)
        with torch.inference_mode():
            want = moe(x)
        assert torch.equal(got, want), step
        assert names.count("moe_gate_up") == names.count("moe_down") == 1


def test_the_parts_table_names_each_runs_kernel_and_expert_slice():
    moe = _moe("Q4_K", "Q6_K", "Q4_K", 2, False)
    experts = moe.experts_gate_up
    blocks = [experts.blocks0, experts.blocks1]
    table = ops.moe_expert_parts(blocks, experts.block_types, EXPERTS, HIDDEN)
    assert table[:, 3].tolist() == [WIDTH, WIDTH]  # weight rows per expert
    assert table[:, 2].tolist() == [b.data_ptr() for b in blocks]
    assert table[:, 4].tolist() == [b.numel() // EXPERTS for b in blocks]
    assert ops.moe_expert_parts(blocks, ["Q4_K", "no-such-type"], EXPERTS, HIDDEN) is None


def test_float_experts_run_as_the_module_in_the_plan():
    moe = SparseMoE(HIDDEN, EXPERTS, 2, WIDTH, norm_topk_prob=True).to(torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        moe.gate.weight.copy_(torch.randn(EXPERTS, HIDDEN, generator=g))
        moe.experts_gate_up.weight.copy_(torch.randn(EXPERTS, 2 * WIDTH, HIDDEN, generator=g) * 0.05)
        moe.experts_down.weight.copy_(torch.randn(EXPERTS, HIDDEN, WIDTH, generator=g) * 0.05)
    x = torch.randn(3, HIDDEN, generator=g).to(torch.bfloat16)
    got, names = _planned(moe, x)
    with torch.inference_mode():
        assert torch.equal(got, moe(x))
    assert "moe_gate_up" not in names
