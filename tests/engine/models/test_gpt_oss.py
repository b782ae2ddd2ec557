"""gpt-oss against transformers on tiny random GptOssForCausalLM models saved with save_pretrained: float32 logits
and greedy tokens on prompts longer than the sliding window, the attention sinks mattering, a sequence alone and
in a ragged batch, chunked prefill, the generator with its sliding layers in window slots, MXFP4 experts
(`*_blocks`/`*_scales`) read as transformers dequantizes them, the sink attention twin on quantized pages, and
configs the model refuses."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from engine.cache import Cache
from engine.errors import ModelLoadError
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Batch, Model
from engine.models.gpt_oss import GptOssForCausalLM, GptOssMoE
from kernels import ops
from kernels.torch_ref import kv_quant

VOCAB = 320  # the tiny_folder tokenizer's
WINDOW = 8
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=32,  # each expert's
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=WINDOW,
    max_position_embeddings=512,
    rope_parameters=dict(
        rope_type="yarn",
        factor=4.0,
        beta_fast=32.0,
        beta_slow=1.0,
        truncate=False,
        original_max_position_embeddings=64,
        rope_theta=150000.0,
    ),
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def _save(hf, folder, tiny_folder):
    hf.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_folder / name, folder / name)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_folder):
    torch.manual_seed(3)
    hf = transformers.GptOssForCausalLM(transformers.GptOssConfig(**BASE)).eval()
    with torch.no_grad():  # experts' and router's biases are zero at init: make them count
        for name, p in hf.named_parameters():
            if name.endswith(("_bias", "router.bias")):
                p.normal_(0, 0.15)
    folder = tmp_path_factory.mktemp("gpt_oss")
    _save(hf, folder, tiny_folder)
    return hf, Model.load(folder, dtype=torch.float32), folder


def _prompts(sizes=(5, 23, 41), seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g) for n in sizes]


def _logits(model, prompts: list[torch.Tensor], page_size: int = 16, **cache_options) -> list[torch.Tensor]:
    """Each prompt's logits from one ragged batch of all of them (pages interleaved across sequences)."""
    cache = Cache(model, max_seq_len=page_size * 4 * len(prompts), page_size=page_size, **cache_options)
    tables = [[p * len(prompts) + i for p in range(4)] for i in range(len(prompts))]
    batch = Batch.build(cache, tables, [0] * len(prompts), [len(p) for p in prompts], logits="all")
    return list(model(torch.cat(prompts), batch.positions(), batch).split([len(p) for p in prompts]))


def test_the_layers_are_transformers(pair):
    hf, ours, _ = pair
    assert isinstance(ours, GptOssForCausalLM)
    windows = [layer.self_attn.sliding_window for layer in ours.model.layers]
    assert windows == [WINDOW if t == "sliding_attention" else None for t in hf.config.layer_types]
    assert windows == [WINDOW, None, WINDOW, None]
    moe = ours.model.layers[0].mlp
    assert isinstance(moe, GptOssMoE) and moe.top_k == 2 and moe.softmax_after_topk
    assert moe.experts_gate_up.bias.shape == (8, 64) and moe.experts_down.bias.shape == (8, 64)


def test_ragged_logits_match_transformers(pair):
    hf, ours, _ = pair
    prompts = _prompts()
    with torch.no_grad():
        for prompt, got in zip(prompts, _logits(ours, prompts)):
            ref = hf(prompt[None]).logits[0]
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4, msg=f"prompt of {len(prompt)}")


def test_greedy_tokens_match_transformers(pair):
    hf, ours, _ = pair
    prompts, steps = _prompts(), 24
    cache = Cache(ours, max_seq_len=16 * 5 * 3, page_size=16)
    tables = [[p * 3 + i for p in range(5)] for i in range(3)]
    past, inputs, generated = [0, 0, 0], prompts, [[], [], []]
    for _ in range(steps):
        batch = Batch.build(cache, tables, past, [len(x) for x in inputs])
        next_ids = ours(torch.cat(inputs), batch.positions(), batch).argmax(-1)
        past, inputs = list(batch.seq_lens_host), [next_ids[i : i + 1] for i in range(3)]
        for i in range(3):
            generated[i].append(int(next_ids[i]))
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            ref = hf.generate(prompt[None], max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
            assert generated[i] == ref[0, len(prompt) :].tolist(), f"prompt {i}"


def test_the_sinks_matter_in_both(pair):
    """Large sinks take most of every row's attention: both models' logits move, and they still agree."""
    hf, ours, _ = pair
    prompt = _prompts((23,), seed=4)[0]
    before = _logits(ours, [prompt])[0]
    hf_sinks = [layer.self_attn.sinks.detach().clone() for layer in hf.model.layers]
    our_sinks = [layer.self_attn.sinks.detach().clone() for layer in ours.model.layers]
    try:
        with torch.no_grad():
            for layer in (*hf.model.layers, *ours.model.layers):
                layer.self_attn.sinks.copy_(torch.tensor([4.0, -1.0, 6.0, 2.0]))
            after = _logits(ours, [prompt])[0]
            ref = hf(prompt[None]).logits[0]
    finally:
        with torch.no_grad():
            for layer, s in zip(hf.model.layers, hf_sinks):
                layer.self_attn.sinks.copy_(s)
            for layer, s in zip(ours.model.layers, our_sinks):
                layer.self_attn.sinks.copy_(s)
    assert (after - before).abs().max() > 0.1
    torch.testing.assert_close(after, ref, atol=1e-4, rtol=1e-4)


def test_a_sequence_alone_and_in_a_ragged_batch_gives_the_same_logits(pair):
    _, ours, _ = pair
    alone = _logits(ours, _prompts((29,), seed=5))[0]
    others = _prompts((3, 17, 40), seed=6)
    together = _logits(ours, [others[0], _prompts((29,), seed=5)[0], *others[1:]])[1]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    assert torch.equal(together.argmax(-1), alone.argmax(-1))


def test_chunked_prefill_equals_one_pass(pair):
    _, ours, _ = pair
    prompt = _prompts((37,), seed=7)[0]
    one_pass = _logits(ours, [prompt])[0]
    cache = Cache(ours, max_seq_len=64, page_size=16)
    chunks, past = [], 0
    for size in (11, 1, 16, 9):
        batch = Batch.build(cache, [[2, 0, 3]], [past], [size], logits="all")
        chunks.append(ours(prompt[past : past + size], batch.positions(), batch))
        past += size
    torch.testing.assert_close(torch.cat(chunks), one_pass, atol=1e-5, rtol=1e-5)


def _generate(model, cache: Cache, prompts: list[list[int]], n: int = 12) -> dict[int, list[int]]:
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


def test_the_generator_with_window_slots_gives_the_tokens_of_a_cache_keeping_every_page(pair):
    """The default Cache of a context past its window pool keeps the sliding layers in window slots."""
    _, ours, _ = pair
    prompts = [p.tolist() for p in _prompts((9, 30, 47, 20), seed=8)]
    max_seq_len = 9216  # past the default pool of 4 * (8 + 2048 + 2 * 16) tokens
    windowed = Cache(ours, max_seq_len=max_seq_len, page_size=16)
    assert windowed.window_layers == {0, 2}
    plain = Cache(ours, max_seq_len=max_seq_len, page_size=16, sliding_tokens=max_seq_len)
    assert not plain.window_layers
    got = _generate(ours, windowed, prompts)
    assert got == _generate(ours, plain, prompts)
    assert all(len(tokens) == 12 for tokens in got.values())


@pytest.mark.parametrize("kv_format", ["q8", "q4"])
def test_sink_attention_on_quantized_pages_is_the_float_twin_on_their_values(kv_format):
    """The uint8 path reads the pages' values (dequantized) as the float path reads a float cache."""
    torch.manual_seed(0)
    page, heads, kv_heads, dim = 4, 4, 2, 32
    k, v = torch.randn(3, 10, kv_heads, dim), torch.randn(3, 10, kv_heads, dim)
    bits = {"q8": 8, "q4": 4}[kv_format]
    qk = torch.zeros(6, page, kv_heads, kv_quant.row_bytes(dim, bits), dtype=torch.uint8)
    qv = torch.zeros_like(qk)
    tables = torch.tensor([[0, 2, 4], [1, 3, 5]])
    slots = torch.cat([tables[i].repeat_interleave(page)[:10] * page + torch.arange(10) % page for i in (0, 1)])
    kv_quant.write_kv(qk, qv, k[:2].reshape(-1, kv_heads, dim), v[:2].reshape(-1, kv_heads, dim), slots)
    fk = kv_quant.dequantize(qk, bits, dim)
    fv = kv_quant.dequantize(qv, bits, dim)
    q, sinks = torch.randn(7, heads, dim), torch.tensor([0.5, 3.0, -2.0, 1.0])
    args = (tables, torch.tensor([10, 10]), [3, 4], [10, 10], dim**-0.5, sinks, 4)
    got = ops.paged_attention_sinks(q, qk, qv, *args)
    ref = kv_quant.rotate(ops.paged_attention_sinks(kv_quant.rotate(q), fk, fv, *args))
    torch.testing.assert_close(got, ref.to(got.dtype), atol=1e-4, rtol=1e-4)


def test_zero_weight_sinks_far_below_the_scores_are_plain_attention():
    torch.manual_seed(1)
    k, v = torch.randn(4, 4, 2, 16), torch.randn(4, 4, 2, 16)
    q = torch.randn(5, 4, 16)
    args = (k, v, torch.tensor([[0, 1, 2, 3]]), torch.tensor([13]), [5], [13], 0.25)
    plain = ops.paged_attention(q, *args, 6)
    sunk = ops.paged_attention_sinks(q, *args, torch.full((4,), -1e4), 6)
    torch.testing.assert_close(sunk, plain, atol=1e-5, rtol=1e-5)


def _mxfp4_pair(rows: int, cols: int, g: torch.Generator, leading: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random HF MXFP4 `_blocks` [E, rows, cols / 32, 16] and `_scales` [E, rows, cols / 32] near 2^0."""
    blocks = torch.randint(0, 256, (leading, rows, cols // 32, 16), generator=g).to(torch.uint8)
    scales = torch.randint(122, 127, (leading, rows, cols // 32), generator=g).to(torch.uint8)
    return blocks, scales


def test_mxfp4_experts_read_as_transformers_dequantizes_them(pair, tmp_path, tiny_folder):
    """A folder whose experts are `_blocks`/`_scales` pairs (as the released checkpoints): our logits are
    transformers' float model holding its own dequantization of them (integrations/mxfp4.py)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf, _, folder = pair
    state = load_file(folder / "model.safetensors")
    reference = transformers.GptOssForCausalLM(hf.config).eval()
    reference.load_state_dict(hf.state_dict())
    g = torch.Generator().manual_seed(9)
    E, H, inter = 8, 64, 32
    for i in range(hf.config.num_hidden_layers):
        prefix = f"model.layers.{i}.mlp.experts"
        experts = reference.model.layers[i].mlp.experts
        for proj, (rows, cols) in (("gate_up_proj", (2 * inter, H)), ("down_proj", (H, inter))):
            blocks, scales = _mxfp4_pair(rows, cols, g, E)
            del state[f"{prefix}.{proj}"]
            state[f"{prefix}.{proj}_blocks"], state[f"{prefix}.{proj}_scales"] = blocks, scales
            with torch.no_grad():  # [E, cols, rows]: transformers' x @ W parameter
                getattr(experts, proj).copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    quantized = tmp_path / "mxfp4"
    quantized.mkdir()
    save_file(state, quantized / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router", "self_attn"]}
    (quantized / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_folder / name, quantized / name)
    ours = Model.load(quantized, dtype=torch.float32)
    prompt = _prompts((21,), seed=10)[0]
    with torch.no_grad():
        torch.testing.assert_close(_logits(ours, [prompt])[0], reference(prompt[None]).logits[0], atol=1e-4, rtol=1e-4)
    kept = Model.load(quantized, dtype=torch.bfloat16)  # the blocks stay packed where the C kernel reads them
    experts = kept.model.layers[0].mlp.experts_gate_up
    if ops.can_keep_blocks("MXFP4", "cpu", torch.bfloat16, H, 2 * inter * E):
        assert experts.block_types == ["MXFP4x16"]
    with torch.no_grad():
        close = _logits(kept, [prompt])[0]
    assert (close.argmax(-1) == _logits(ours, [prompt])[0].argmax(-1)).float().mean() > 0.8


@pytest.mark.parametrize("missing", ["num_local_experts", "num_experts_per_tok"])
def test_a_config_without_an_expert_count_is_refused_naming_it(pair, tmp_path, missing):
    _, _, folder = pair
    config = json.loads((folder / "config.json").read_text())
    del config[missing]
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(folder / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=missing):
        Model.load(tmp_path, dtype=torch.float32)
