"""GGUF Q4_0 / Q4_1 weights kept packed 4-bit, and Q8_0 weights (projections and the output head, tied or not)
as two 4-bit planes, where the block kernels do not read them (float32 here): same logits and greedy tokens as
the dequantized model. In bfloat16 on a CPU the same files keep their blocks (repacked, "Q4_0x16").

Int8 values tried for the split: the extremes -128 and 127, -1, 0, 15, 16, -16 and random ones."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from engine.cache import Cache
from engine.models import Batch, Model
from engine.models.linear import Linear, QuantizedWeight, SplitWeight
from kernels import dispatch, ops
from kernels.torch_ref import quant

# The GGUF writer the loading tests use (tests are not a package, so load it by path).
_spec = importlib.util.spec_from_file_location(
    "gguf_kit_conftest", Path(__file__).parents[1] / "loading" / "conftest.py"
)
kit = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(kit)

PROMPT = [1, 5, 9, 11, 20, 7, 3, 14]
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def _logits(model: Model, ids: list[int]) -> torch.Tensor:
    cache = Cache(model, max_seq_len=64, page_size=16)
    batch = Batch.build(cache, [[0, 1, 2, 3]], [0], [len(ids)], logits="all")
    return model(torch.tensor(ids), batch.positions(), batch)


def _greedy(model: Model, ids: list[int], steps: int) -> list[int]:
    """Prefill `ids`, then decode `steps` tokens one at a time over the paged cache."""
    cache = Cache(model, max_seq_len=64, page_size=16)
    past, new, out = 0, list(ids), []
    for _ in range(steps):
        batch = Batch.build(cache, [[0, 1, 2, 3]], [past], [len(new)])
        token = int(model(torch.tensor(new), batch.positions(), batch)[-1].argmax())
        past, new = past + len(new), [token]
        out.append(token)
    return out


def _projections(model: Model) -> list[Linear]:
    return [m for name, m in model.named_modules() if isinstance(m, Linear) and name != "lm_head"]


def _write(tmp_path: Path, architecture: str, qtype: str) -> Path:
    model = kit.tiny_model(architecture, **TINY)
    return kit.write_gguf(tmp_path / f"tiny-{qtype}.gguf", model, qtype).path


@pytest.mark.parametrize(
    "architecture,qtype",
    [("LlamaForCausalLM", "Q4_1"), ("LlamaForCausalLM", "Q4_0"), ("Qwen2ForCausalLM", "Q4_0")],
)
def test_packed_model_matches_dequantized(tmp_path, architecture, qtype):
    path = _write(tmp_path, architecture, qtype)
    reference = Model.load(path, dtype=torch.float32, quantized=None)
    packed = Model.load(path, dtype=torch.float32, quantized="int4")
    assert all(m.is_quantized for m in _projections(packed)) and len(_projections(packed)) == 4 * 2
    assert not any(m.is_quantized for m in _projections(reference))
    assert not packed.lm_head.weight.is_meta and packed.model.embed_tokens.weight.dtype == torch.float32
    torch.testing.assert_close(_logits(packed, PROMPT), _logits(reference, PROMPT), rtol=1e-5, atol=1e-4)
    assert _greedy(packed, PROMPT, 6) == _greedy(reference, PROMPT, 6)


def test_packed_weights_equal_the_unpermuted_float_weights(tmp_path):
    # llama.cpp interleaves each q/k head's rotary halves; the loader must undo that on the integer rows
    # and on their scale/zero rows alike, so the packed weight is exactly the dequantized HF-order weight.
    path = _write(tmp_path, "LlamaForCausalLM", "Q4_1")
    reference = Model.load(path, dtype=torch.float32, quantized=None)
    packed = Model.load(path, dtype=torch.float32, quantized="int4")
    for ref, layer in zip(reference.model.layers, packed.model.layers):
        for name in ("qkv_proj", "o_proj"):
            module = getattr(layer.self_attn, name)
            weight = quant.dequantize_int4(module.packed, module.scales_and_zeros, 32, torch.float32)
            torch.testing.assert_close(weight, getattr(ref.self_attn, name).weight, rtol=0, atol=1e-6)


def test_forced_reference_gives_the_same_logits(tmp_path, monkeypatch):
    path = _write(tmp_path, "LlamaForCausalLM", "Q4_1")
    packed = Model.load(path, dtype=torch.float32, quantized="int4")
    monkeypatch.setattr(dispatch, "_force_reference", False)
    fast = _logits(packed, PROMPT)
    monkeypatch.setattr(dispatch, "_force_reference", True)  # what TANDEM_FORCE_REFERENCE=1 sets
    assert dispatch.candidates("linear_int4") == [quant.linear_int4]
    torch.testing.assert_close(_logits(packed, PROMPT), fast, rtol=1e-5, atol=1e-4)


def test_a_batched_bfloat16_decode_step_through_the_block_kernel_matches_the_twins(tmp_path, monkeypatch):
    from kernels.cpu import blocks as cpu_blocks

    model = Model.load(_write(tmp_path, "LlamaForCausalLM", "Q4_1"), dtype=torch.bfloat16)
    cache = Cache(model, max_seq_len=128, page_size=16)
    tables, lengths = [[0, 1], [2, 3], [4], [5, 6, 7]], [5, 17, 3, 40]
    for table, n in zip(tables, lengths):  # fill each sequence's history
        batch = Batch.build(cache, [table], [0], [n])
        model(torch.arange(1, n + 1) % 20, batch.positions(), batch)
    step = Batch.build(cache, tables, lengths, [1] * 4)  # one new token each, as a decode step
    calls = []
    matmul = cpu_blocks._matmul
    monkeypatch.setattr(cpu_blocks, "_matmul", lambda source: calls.append(source) or matmul(source))
    ours = model(torch.tensor([3, 9, 12, 18]), step.positions(), step).float()
    if matmul("block32_matmul") is None:
        pytest.skip("no C compiler: the block kernel is not built here")
    assert "block32_matmul" in calls, "the decode step did not reach the block kernel"
    monkeypatch.setattr(dispatch, "_force_reference", True)  # every op on its torch twin
    theirs = model(torch.tensor([3, 9, 12, 18]), step.positions(), step).float()
    atol = 0.05 * theirs.abs().max().item()
    torch.testing.assert_close(ours, theirs, rtol=0.05, atol=atol)
    # Random weights can put two logits within bfloat16 rounding of each other, and which one wins then
    # depends on the CPU: each row's choice must be the other's best or tie with it within the tolerance.
    chosen = theirs.gather(-1, ours.argmax(-1, keepdim=True)).squeeze(-1)
    assert torch.all(chosen >= theirs.amax(-1) - atol)


def test_bfloat16_on_cpu_keeps_blocks_by_default_and_float32_packs_int4_only_when_asked(tmp_path):
    path = _write(tmp_path, "LlamaForCausalLM", "Q4_0")
    assert all(m.is_quantized for m in _projections(Model.load(path, dtype=torch.bfloat16)))
    assert not any(m.is_quantized for m in _projections(Model.load(path, dtype=torch.float32)))
    bf16 = Model.load(path, dtype=torch.bfloat16)
    if ops.can_keep_blocks("Q4_0", "cpu", torch.bfloat16, 64, 96):
        assert bf16.model.layers[0].mlp.down_proj.block_types == ["Q4_0x16"]  # the block kernel's layout
    else:  # no C compiler: torch's int4 form
        assert bf16.model.layers[0].mlp.down_proj.scales_and_zeros.dtype == torch.bfloat16
    assert not any(m.is_quantized for m in _projections(Model.load(path, dtype=torch.bfloat16, quantized=None)))


def test_misspelled_quantized_option_is_an_error(tmp_path):
    path = _write(tmp_path, "LlamaForCausalLM", "Q4_0")
    with pytest.raises(ValueError, match="int8"):
        Model.load(path, dtype=torch.float32, quantized="int8")


def test_q8_0_projections_and_tied_head_pack_as_two_planes(tmp_path):
    from engine.gguf.checkpoint import load_gguf

    model = kit.tiny_model("LlamaForCausalLM", tie_word_embeddings=True, **TINY)
    path = kit.write_gguf(tmp_path / "tied.gguf", model, "Q8_0").path
    config, tensors = load_gguf(path, dtype=torch.float32, quantized="int4")
    assert config.tie_word_embeddings and isinstance(tensors["lm_head.weight"], SplitWeight)
    reference = Model.load(path, dtype=torch.float32, quantized=None)
    packed = Model.load(path, dtype=torch.float32, quantized="int4")
    assert all(m.is_quantized and m.packed_low is not None for m in _projections(packed))
    # the tiny vocabulary (40 rows) is no multiple of 16, so this head falls back to floats; the starter's packs
    assert packed.model.embed_tokens.weight.dtype == torch.float32  # lookups still read floats
    torch.testing.assert_close(_logits(packed, PROMPT), _logits(reference, PROMPT), rtol=1e-5, atol=1e-4)
    assert _greedy(packed, PROMPT, 6) == _greedy(reference, PROMPT, 6)


def test_an_untied_q8_0_head_packs_too(tmp_path):
    from engine.gguf.checkpoint import load_gguf

    model = kit.tiny_model("LlamaForCausalLM", tie_word_embeddings=False, **TINY)
    path = kit.write_gguf(tmp_path / "untied.gguf", model, "Q8_0").path
    config, tensors = load_gguf(path, dtype=torch.float32, quantized="int4")
    assert not config.tie_word_embeddings and isinstance(tensors["lm_head.weight"], SplitWeight)
    packed = Model.load(path, dtype=torch.float32, quantized="int4")
    reference = Model.load(path, dtype=torch.float32, quantized=None)
    torch.testing.assert_close(_logits(packed, PROMPT), _logits(reference, PROMPT), rtol=1e-5, atol=1e-4)


def test_the_two_planes_sum_exactly_to_the_int8_weight():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-128, 128, (32, 64), generator=g, dtype=torch.int8)
    q[0, :8] = torch.tensor([-128, 127, -1, 0, 15, 16, -16, 1], dtype=torch.int8)
    scales = torch.rand(32, 2, generator=g) + 0.01
    split = SplitWeight.from_int8(q, scales, 32, torch.float32)
    assert split.high.values.max() <= 15 and split.low.values.max() <= 15
    high, low = split.high.values.long() - 8, split.low.values.long() - 8
    assert torch.equal(16 * high + low + 8, q.long())  # the integers split exactly
    assert torch.equal(split.high.scales, 16 * scales) and torch.equal(split.low.zeros, 8 * scales)
    assert torch.equal(split.high.zeros, torch.zeros_like(scales)) and torch.equal(split.low.scales, scales)
    exact = q.float() * scales.repeat_interleave(32, 1)
    torch.testing.assert_close(split.dequantize(), exact, rtol=1e-6, atol=1e-5)
    module = Linear(64, 32, bias=False)
    module.load_quantized(split, device="cpu")
    x = torch.randn(5, 64, generator=g)
    torch.testing.assert_close(module(x), x @ exact.t(), rtol=1e-5, atol=1e-4)


def test_shape_the_kernel_cannot_hold_falls_back_to_float():
    g = torch.Generator().manual_seed(0)
    values = torch.randint(0, 16, (24, 64), generator=g, dtype=torch.uint8)  # 24 rows: not a multiple of 16
    weight = QuantizedWeight(values, torch.rand(24, 2, generator=g), torch.randn(24, 2, generator=g), 32, torch.float32)
    module = Linear(64, 24, bias=False)
    module.load_quantized(weight, device="cpu")
    assert not module.is_quantized
    x = torch.randn(3, 64)
    torch.testing.assert_close(module(x), x @ weight.dequantize().t())


def test_starter_packed_matches_dequantized(starter_gguf):
    reference = Model.load(starter_gguf, dtype=torch.float32, quantized=None)
    packed = Model.load(starter_gguf, dtype=torch.float32, quantized="int4")
    assert all(m.is_quantized for m in _projections(packed))
    assert packed.lm_head.packed_low is not None  # its tied Q8_0 embeddings, as two planes
    prompt = [1, 504, 3458, 314, 260, 1142, 282, 4763, 30, 198]
    torch.testing.assert_close(_logits(packed, prompt), _logits(reference, prompt), rtol=1e-4, atol=1e-3)
    assert _greedy(packed, prompt, 4) == _greedy(reference, prompt, 4)


def test_mixed_quant_types_in_one_fused_projection_fall_back_to_float(tmp_path):
    # real Q4 files keep some tensors at higher precision; a fused qkv with one float part is dequantized whole
    from engine.gguf.checkpoint import load_gguf
    from engine.models.llama import LlamaForCausalLM

    path = _write(tmp_path, "LlamaForCausalLM", "Q4_1")
    config, tensors = load_gguf(path, dtype=torch.float32, quantized="int4")
    name = "model.layers.0.self_attn.k_proj.weight"
    assert isinstance(tensors[name], QuantizedWeight)
    tensors[name] = tensors[name].dequantize()
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_tensors(tensors)
    model.rope.inv_freq = model.rope.inv_freq.to("cpu")
    assert not model.model.layers[0].self_attn.qkv_proj.is_quantized
    assert model.model.layers[1].self_attn.qkv_proj.is_quantized and model.model.layers[0].mlp.down_proj.is_quantized
    reference = Model.load(path, dtype=torch.float32, quantized=None)
    torch.testing.assert_close(_logits(model, PROMPT), _logits(reference, PROMPT), rtol=1e-5, atol=1e-4)


def test_the_starters_tied_head_shares_the_tables_blocks_and_computes_rows_alone(starter_gguf):
    # The head reads the embedding table's repacked Q8_0 blocks at every row count: no float copy to switch to
    # for many rows, so a row's logits are the same whatever rows come with it (batch invariance).
    model = Model.load(starter_gguf, dtype=torch.bfloat16)
    if not ops.can_keep_blocks("Q8_0", "cpu", torch.bfloat16, 576, 49152):
        pytest.skip("no C compiler: the block kernel is not built here")
    head, embeddings = model.lm_head, model.model.embed_tokens
    assert head.block_types == ["Q8_0x16"] and head.blocks0.data_ptr() == embeddings.blocks.data_ptr()
    x = torch.randn(40, 576, generator=torch.Generator().manual_seed(0)).bfloat16()
    together = head(x)
    for rows in ((0, 1), (5, 11), (39, 40)):
        assert torch.equal(head(x[rows[0] : rows[1]]), together[rows[0] : rows[1]])
