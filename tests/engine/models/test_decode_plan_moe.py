"""Recorded decode steps (engine/models/decode_plan.py) of mixture-of-experts models give the same bits as the
layers' modules: Qwen3-MoE (Q4_K gate/up experts, Q6_K down in the last layer) and gpt-oss (MXFP4 experts with
biases and the clamped SwiGLU, a sink logit per head, sliding-window layers), as tools/make_bench_model.py writes
them small; 1 and several rows, over bfloat16 and quantized pages, and gpt-oss's window slots through the generator.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from engine import Cache, Model
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import decode_plan
from engine.models.batch import Batch
from engine.models.moe import SparseMoE
from kernels.cpu import blocks as cpu_blocks

_SPEC = importlib.util.spec_from_file_location(
    "make_bench_model", Path(__file__).resolve().parents[3] / "tools" / "make_bench_model.py"
)
bench_model = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench_model
_SPEC.loader.exec_module(bench_model)

SHAPE = {"hidden": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "num_experts": 16, "experts_used": 4}
SHAPE |= {"expert_ffn": 256, "context_length": 2048}
WINDOW = 16  # gpt-oss's sliding layers: short, so the prompts here reach past it

pytestmark = pytest.mark.skipif(
    not cpu_blocks.supports("Q4_K", "cpu", torch.bfloat16, 256, 16), reason="needs a C compiler for the block kernels"
)


@pytest.fixture(scope="module", params=["qwen3moe", "gpt-oss"])
def model(request, tmp_path_factory, starter_gguf):
    shape = request.param
    moe = SHAPE | ({"sliding_window": WINDOW} if shape == "gpt-oss" else {})
    path = tmp_path_factory.mktemp("plan-moe") / f"tiny-{shape}.gguf"
    type_name = "MXFP4" if shape == "gpt-oss" else "Q4_K_M"
    bench_model.write_bench_model(path, type_name, 2, shape=shape, moe=moe, tokenizer_gguf=starter_gguf)
    loaded = Model.load(path, dtype=torch.bfloat16)
    assert all(isinstance(layer.mlp, SparseMoE) for layer in loaded.model.layers)
    assert all(layer.mlp.experts_down.block_types for layer in loaded.model.layers)  # experts kept in blocks
    return loaded


def decode(model: Model, cache: Cache, tables, past, tokens, planned: bool, monkeypatch) -> torch.Tensor:
    """One decode step (each sequence adds one token) through a plan or through the modules."""
    with monkeypatch.context() as m:
        if not planned:
            m.setattr(decode_plan, "covers", lambda batch, inputs: False)
        batch = Batch.build(cache, tables, past, [1] * len(past))
        with torch.inference_mode():
            return model(torch.tensor(tokens), batch.positions(), batch)


def prefill(model: Model, cache: Cache, tables, prompts) -> None:
    batch = Batch.build(cache, tables, [0] * len(prompts), [len(p) for p in prompts])
    with torch.inference_mode():
        model(torch.tensor([t for p in prompts for t in p]), batch.positions(), batch)


@pytest.mark.parametrize("kv_format", [None, "q8"])
@pytest.mark.parametrize("rows", [1, 5])
def test_a_planned_moe_step_equals_the_modules(model, rows, kv_format, monkeypatch):
    g = torch.Generator().manual_seed(rows)
    prompts = [
        torch.randint(0, 1000, (int(n),), generator=g).tolist() for n in torch.randint(5, 40, (rows,), generator=g)
    ]
    options = {} if kv_format is None else {"kv_format": kv_format}
    # every page kept for the sliding layers too (window slots: the generator's test below)
    caches = [Cache(model, max_seq_len=1024, page_size=16, sliding_tokens=1024, **options) for _ in range(2)]
    assert not caches[0].window_layers
    tables = [list(range(4 * i, 4 * i + 4)) for i in range(rows)]
    for cache in caches:
        prefill(model, cache, tables, prompts)
    past = [len(p) for p in prompts]
    for step in range(6):
        tokens = torch.randint(0, 1000, (rows,), generator=g).tolist()
        planned = decode(model, caches[0], tables, past, tokens, True, monkeypatch)
        plain = decode(model, caches[1], tables, past, tokens, False, monkeypatch)
        assert torch.equal(planned, plain), step
        past = [p + 1 for p in past]
    plan = decode_plan.plans_for(model, caches[0])[rows]
    assert plan is not None and plan._head is not None
    names = [getattr(fn, "__name__", "") for fn, _ in plan._plan._calls]
    layers = len(model.model.layers)
    assert names.count("moe_gate_up") == names.count("moe_down") == layers  # the experts in C, not the module
    for k, k_plain in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        assert torch.equal(k, k_plain)


def test_gpt_oss_sinks_are_bound(model, monkeypatch):
    """The plan's attention reads each layer's sinks: with them changed, its step changes as the modules' does."""
    if not hasattr(model.model.layers[0].self_attn, "sinks"):
        pytest.skip("gpt-oss only")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.add_(3.0)
    try:
        caches = [Cache(model, max_seq_len=256, page_size=16, sliding_tokens=256) for _ in range(2)]
        tables, prompts = [[0, 1], [2, 3]], [[3, 9, 12], [5] * 20]
        for cache in caches:
            prefill(model, cache, tables, prompts)
        planned = decode(model, caches[0], tables, [3, 20], [11, 13], True, monkeypatch)
        assert torch.equal(planned, decode(model, caches[1], tables, [3, 20], [11, 13], False, monkeypatch))
    finally:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.sub_(3.0)


def _generate(model, cache: Cache, prompts: list[list[int]], n: int = 10) -> dict[int, list[int]]:
    generator = DynamicGenerator(model, cache, model.tokenizer, max_chunk_size=16)
    generator.enqueue(
        [
            DynamicJob(torch.tensor([p]), n, min_new_tokens=n, stop_conditions=[], gen_settings=SamplerSettings.greedy(),
                       identifier=i)
            for i, p in enumerate(prompts)
        ]
    )  # fmt: skip
    out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    for _ in range(500):
        if not generator.num_remaining_jobs():
            return out
        for result in generator.iterate():
            if "token_ids" in result:
                out[result["identifier"]] += result["token_ids"].flatten().tolist()
    raise AssertionError("the generator did not finish")


def test_the_generator_with_plans_gives_the_tokens_of_the_modules(model, monkeypatch):
    """Window slots for gpt-oss's sliding layers (a cache past its window pool), jobs joining a running batch."""
    prompts = [[3 + i * 7 + j for j in range(n)] for i, n in enumerate((9, 30, 21))]
    windowed = Cache(model, max_seq_len=9216, page_size=16)
    assert bool(windowed.window_layers) == hasattr(model.model.layers[0].self_attn, "sinks")
    got = _generate(model, windowed, prompts)
    assert decode_plan.plans_for(model, windowed)  # the decode steps went through plans
    with monkeypatch.context() as m:
        m.setattr(decode_plan, "covers", lambda batch, inputs: False)
        assert got == _generate(model, Cache(model, max_seq_len=9216, page_size=16), prompts)
