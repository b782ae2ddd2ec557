"""Recorded decode steps (engine/models/decode_plan.py) give the same bits as the layers' modules.

Tried: Q4_K_M, Q4_0 and Q8_0 files from tools/make_bench_model.py (a fused qkv of two types, Q6_K beside Q4_K;
32-value types), 1, 3 and 7 rows, sequences crossing page boundaries (pages of 16), steps after a new cache,
the thread count changed between steps, caches of 8- and 4-bit pages (kv_format q8, q4); and what a plan must leave to the modules: float weights, a batch
with prompt tokens, TANDEM_FORCE_REFERENCE. The starter's greedy answers
with and without plans are compared in tests/engine/generator/test_batch_invariance.py's runs too (every
decode step there goes through a plan).
"""

from __future__ import annotations

import gc
import importlib.util
import sys
import weakref
from pathlib import Path

import pytest
import torch

from engine import Cache, Model
from engine.models import decode_plan
from engine.models.batch import Batch
from kernels import dispatch
from kernels.cpu import blocks as cpu_blocks

_SPEC = importlib.util.spec_from_file_location(
    "make_bench_model", Path(__file__).resolve().parents[3] / "tools" / "make_bench_model.py"
)
bench_model = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench_model
_SPEC.loader.exec_module(bench_model)

# tests/engine/loading/conftest.py's GGUF writer, for tiny Qwen2 and Qwen3 files
_KIT = importlib.util.spec_from_file_location(
    "gguf_kit", Path(__file__).resolve().parents[1] / "loading" / "conftest.py"
)
gguf_kit = importlib.util.module_from_spec(_KIT)
sys.modules[_KIT.name] = gguf_kit  # its dataclasses look their module up there
_KIT.loader.exec_module(gguf_kit)

TINY = {"hidden": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "ffn_hidden": 512, "context_length": 2048}

pytestmark = pytest.mark.skipif(
    not cpu_blocks.supports("Q4_K", "cpu", torch.bfloat16, 256, 16), reason="needs a C compiler for the block kernels"
)


@pytest.fixture(scope="module", params=["Q4_K_M", "Q4_0", "Q8_0"])
def model(request, tmp_path_factory, starter_gguf):
    path = tmp_path_factory.mktemp("plan") / f"tiny-{request.param}.gguf"
    bench_model.write_bench_model(path, request.param, num_layers=3, tokenizer_gguf=starter_gguf, **TINY)
    return Model.load(path)


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


@pytest.mark.parametrize("rows", [1, 3, 7])
def test_a_planned_step_equals_the_modules(model, rows, monkeypatch):
    g = torch.Generator().manual_seed(rows)
    prompts = [
        torch.randint(0, 1000, (int(n),), generator=g).tolist() for n in torch.randint(5, 40, (rows,), generator=g)
    ]
    caches = [Cache(model, max_seq_len=1024, page_size=16) for _ in range(2)]
    tables = [list(range(4 * i, 4 * i + 4)) for i in range(rows)]  # 64 tokens each: steps cross page ends
    for cache in caches:
        prefill(model, cache, tables, prompts)
    past = [len(p) for p in prompts]
    for step in range(12):
        tokens = torch.randint(0, 1000, (rows,), generator=g).tolist()
        planned = decode(model, caches[0], tables, past, tokens, True, monkeypatch)
        plain = decode(model, caches[1], tables, past, tokens, False, monkeypatch)
        assert torch.equal(planned, plain), step
        past = [p + 1 for p in past]
        if step == 5:
            torch.set_num_threads(1)  # the thread policy's move: read at the next step
    torch.set_num_threads(2)
    plan = decode_plan.plans_for(model, caches[0])[rows]
    assert plan is not None and plan.cache is caches[0] and not decode_plan.plans_for(model, caches[1])
    assert plan._head is not None  # the final norm and the head ran in the plan too
    for k, k_plain in zip(caches[0].k, caches[1].k):
        assert torch.equal(k, k_plain)  # the cache rows it wrote too


@pytest.mark.parametrize("kv_format", ["q8", "q4"])
def test_a_planned_step_over_quantized_pages_equals_the_modules(model, kv_format, monkeypatch):
    # the plan binds the quantized write and decode kernels where the modules dispatch to them
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (30, 7, 15)]
    caches = [Cache(model, max_seq_len=512, page_size=16, kv_format=kv_format) for _ in range(2)]
    tables = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    for cache in caches:
        prefill(model, cache, tables, prompts)
    past = [len(p) for p in prompts]
    for step in range(4):  # the first and third sequences cross into their next page
        tokens = torch.randint(0, 1000, (3,), generator=g).tolist()
        planned = decode(model, caches[0], tables, past, tokens, True, monkeypatch)
        assert torch.equal(planned, decode(model, caches[1], tables, past, tokens, False, monkeypatch)), step
        past = [p + 1 for p in past]
    plan = decode_plan.plans_for(model, caches[0])[3]
    assert plan is not None
    names = {getattr(fn, "__name__", "") for fn, _ in plan._plan._calls}
    assert {"kv_quant_write", "paged_decode_quant"} <= names
    for k, k_plain in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        assert k.dtype == torch.uint8 and torch.equal(k, k_plain)


@pytest.mark.parametrize("architecture", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_qwen_layers_biases_and_head_norms_equal_the_modules(architecture, tmp_path, monkeypatch):
    # Qwen2's q/k/v biases added after the kernel, Qwen3's per-head q/k norms a token at a time
    shape = dict(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    kit = gguf_kit.GGUFKit(tmp_path)
    written = kit.write(kit.model(architecture, tie_word_embeddings=False, **shape), "Q4_0")
    model = Model.load(written.path)
    caches = [Cache(model, max_seq_len=256, page_size=16) for _ in range(2)]
    tables, prompts = [[0, 1], [2, 3], [4, 5]], [[3, 9, 12], [5] * 20, [7, 8]]
    for cache in caches:
        prefill(model, cache, tables, prompts)
    past = [len(p) for p in prompts]
    for step in range(4):
        tokens = [11 + step, 13, 17]
        planned = decode(model, caches[0], tables, past, tokens, True, monkeypatch)
        assert torch.equal(planned, decode(model, caches[1], tables, past, tokens, False, monkeypatch)), step
        past = [p + 1 for p in past]
    assert decode_plan.plans_for(model, caches[0])[3] is not None


def test_a_cache_the_slot_copy_declines_is_written_by_torch(model, monkeypatch):
    """Where write_slots will not take a cache, the plan writes each step's keys and values with index_put_
    (pages and offsets from the batch's slots), still equal to the modules' step."""
    monkeypatch.setattr(decode_plan.ops, "bind_write_slots", lambda *args: None)
    caches = [Cache(model, max_seq_len=256, page_size=16) for _ in range(2)]
    tables, prompts = [[0, 1], [2, 3]], [[3, 9, 12], [5] * 15]
    for cache in caches:
        prefill(model, cache, tables, prompts)
    past = [len(p) for p in prompts]
    for step in range(3):  # the second sequence's steps cross into its next page
        tokens = [11 + step, 13]
        planned = decode(model, caches[0], tables, past, tokens, True, monkeypatch)
        assert torch.equal(planned, decode(model, caches[1], tables, past, tokens, False, monkeypatch)), step
        past = [p + 1 for p in past]
    assert decode_plan.plans_for(model, caches[0])[2] is not None
    for k, k_plain in zip(caches[0].k, caches[1].k):
        assert torch.equal(k, k_plain)


def test_a_head_the_kernels_do_not_take_is_left_to_the_modules(model, monkeypatch):
    """A plan whose head did not record (a float output weight, say) runs its layers and returns the hidden
    state; the model's forward applies the final norm and the head as modules, to the same logits."""
    monkeypatch.setattr(decode_plan, "_record_head", lambda *args: None)
    caches = [Cache(model, max_seq_len=256, page_size=16) for _ in range(2)]
    tables, prompts = [[0, 1]], [[3, 9, 12]]
    for cache in caches:
        prefill(model, cache, tables, prompts)
    for step in range(2):
        planned = decode(model, caches[0], tables, [3 + step], [11 + step], True, monkeypatch)
        assert torch.equal(planned, decode(model, caches[1], tables, [3 + step], [11 + step], False, monkeypatch))
    plan = decode_plan.plans_for(model, caches[0])[1]
    assert plan is not None and plan._head is None


def test_plans_live_with_their_cache(model, monkeypatch):
    tables, prompts = [[0, 1]], [[5, 6, 7]]
    first = Cache(model, max_seq_len=256, page_size=16)
    prefill(model, first, tables, prompts)
    decode(model, first, tables, [3], [9], True, monkeypatch)
    plan = weakref.ref(decode_plan.plans_for(model, first)[1])
    second = Cache(model, max_seq_len=512, page_size=16)
    prefill(model, second, tables, prompts)
    decode(model, second, tables, [3], [9], True, monkeypatch)
    assert decode_plan.plans_for(model, second)[1].cache is second
    del first
    gc.collect()
    assert plan() is None  # a cache the app lets go takes its plans (and their buffers) with it


def test_a_batch_with_prompt_tokens_takes_the_modules(model):
    cache = Cache(model, max_seq_len=256, page_size=16)
    mixed = Batch.build(cache, [[0], [1]], [3, 0], [1, 5])
    assert not decode_plan.covers(mixed, torch.zeros(6, dtype=torch.int64))
    assert decode_plan.covers(Batch.build(cache, [[0], [1]], [3, 4], [1, 1]), torch.zeros(2, dtype=torch.int64))


def test_models_a_plan_does_not_cover_record_none(tiny_folder):
    # float weights (a Hugging Face folder): the projections are not GGUF blocks
    model = Model.load(tiny_folder, dtype=torch.bfloat16)
    cache = Cache(model, max_seq_len=256, page_size=16)
    assert decode_plan.DecodePlan.record(model, cache, 1, cache.num_pages) is None


def test_force_reference_turns_plans_off(model, monkeypatch):

    monkeypatch.setattr(dispatch, "_force_reference", True)
    cache = Cache(model, max_seq_len=256, page_size=16)
    assert decode_plan.DecodePlan.record(model, cache, 1, cache.num_pages) is None
