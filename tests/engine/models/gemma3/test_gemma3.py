"""Gemma 3's text model (Gemma3ForCausalLM) against transformers: ragged-batch logits, chunked prefill and greedy
tokens over the paged cache, with prompts longer than the sliding window so both layer kinds matter; the config
layouts of transformers 4 and 5; bad configs named."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from engine.cache import Cache
from engine.errors import ModelLoadError
from engine.models import Batch, Model
from engine.models.gemma3 import Gemma3ForCausalLM

VOCAB = 211
WINDOW = 5

BASE = dict(
    vocab_size=VOCAB,
    hidden_size=80,  # sqrt(80) is not exact in bfloat16, so the embedding scale's rounding is visible
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,  # heads * head_dim != hidden_size
    query_pre_attn_scalar=20,  # != head_dim: the attention scale comes from this
    sliding_window=WINDOW,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
    },
    max_position_embeddings=512,
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
)
CASES = {
    "tied-softcap": dict(tie_word_embeddings=True, final_logit_softcapping=3.0),
    "untied": dict(tie_word_embeddings=False),
}


def _build(name: str, folder) -> transformers.Gemma3ForCausalLM:
    torch.manual_seed(7)
    hf = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**BASE, **CASES[name])).eval()
    with torch.no_grad():  # the norms start at zero, i.e. a scale of exactly 1: make (1 + weight) matter
        for param_name, p in hf.named_parameters():
            if "norm" in param_name:
                p.normal_(0, 0.3)
    hf.save_pretrained(folder)
    return hf


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = _build(request.param, folder)
    return request.param, hf, Model.load(folder, dtype=torch.float32), folder


def _prompt(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _reference_logits(hf, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=ids[None]).logits[0]


def test_structure(pair):
    name, hf, ours, _ = pair
    assert isinstance(ours, Gemma3ForCausalLM)
    assert [layer.is_sliding for layer in ours.model.layers] == [True, False, True, False]
    assert [layer.self_attn.sliding_window for layer in ours.model.layers] == [WINDOW, None, WINDOW, None]
    assert ours.model.layers[0].self_attn.scale == 20**-0.5
    tied = ours.lm_head.weight is ours.model.embed_tokens.weight
    assert tied == hf.config.tie_word_embeddings, name


def test_ragged_batch_logits_match(pair):
    name, hf, ours, _ = pair
    prompts = [_prompt(13, 1), _prompt(9, 2)]  # both longer than the window
    cache = Cache(ours, max_seq_len=64, page_size=4)
    batch = Batch.build(cache, [[0, 2, 4, 6], [1, 3, 5]], [0, 0], [13, 9], logits="all")  # interleaved pages
    logits = ours(torch.cat(prompts), batch.positions(), batch)
    start = 0
    for i, p in enumerate(prompts):
        ref = _reference_logits(hf, p)
        torch.testing.assert_close(logits[start : start + len(p)], ref, atol=1e-4, rtol=1e-4, msg=f"{name}: {i}")
        start += len(p)


def test_chunked_prefill_matches_one_pass(pair):
    name, hf, ours, _ = pair
    prompt = _prompt(23, 3)
    ref = _reference_logits(hf, prompt)
    cache = Cache(ours, max_seq_len=64, page_size=4)
    table = [[5, 0, 7, 2, 9, 1]]
    past, got = 0, []
    for size in (7, 1, 8, 4, 3):  # boundaries inside pages and inside the window
        batch = Batch.build(cache, table, [past], [size], logits="all")
        got.append(ours(prompt[past : past + size], batch.positions(), batch))
        past += size
    torch.testing.assert_close(torch.cat(got), ref, atol=1e-4, rtol=1e-4, msg=name)


def test_greedy_tokens_match(pair):
    name, hf, ours, _ = pair
    steps, page_size = 32, 4
    prompt = _prompt(11, 4)
    cache = Cache(ours, max_seq_len=64, page_size=page_size)
    table = [[3, 8, 1, 12, 0, 6, 10, 2, 14, 4, 7]]  # 11 pages for 11 + 32 tokens, out of order
    batch = Batch.build(cache, table, [0], [6], logits=[[]])
    ours(prompt[:6], batch.positions(), batch)  # prefill in two chunks
    inputs, past, generated = prompt[6:], 6, []
    for _ in range(steps):
        batch = Batch.build(cache, table, [past], [len(inputs)])
        next_id = ours(inputs, batch.positions(), batch).argmax(-1)
        past = batch.seq_lens_host[0]
        inputs = next_id
        generated.append(int(next_id))
    with torch.no_grad():
        ref = hf.generate(input_ids=prompt[None], max_new_tokens=steps, do_sample=False, eos_token_id=None)
    assert generated == ref[0, len(prompt) :].tolist(), name


def test_bfloat16_embeddings_and_norms_round_like_the_reference(pair):
    name, hf, _, folder = pair
    ours = Model.load(folder, dtype=torch.bfloat16)
    ref = transformers.Gemma3ForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    ids = _prompt(17, 5)
    with torch.no_grad():
        embedded = ref.model.embed_tokens(ids)
        assert torch.equal(ours.embed(ids), embedded), name
        assert torch.equal(
            ours.model.layers[0].input_layernorm(embedded), ref.model.layers[0].input_layernorm(embedded)
        )


def test_transformers_4_config_keys_give_the_same_model(pair, tmp_path):
    # Released Gemma 3 configs predate rope_parameters/layer_types: rope_theta, rope_local_base_freq,
    # rope_scaling and sliding_window_pattern say the same thing.
    name, _, ours, folder = pair
    config = json.loads((folder / "config.json").read_text())
    for key in ("rope_parameters", "layer_types", "_sliding_window_pattern"):
        config.pop(key, None)
    config.update(
        rope_theta=5000.0,
        rope_local_base_freq=100.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        sliding_window_pattern=2,
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    old_style = Model.load(tmp_path, dtype=torch.float32)
    assert old_style.settings == ours.settings, name
    ref = transformers.Gemma3ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    prompt = _prompt(12, 6)
    cache = Cache(old_style, max_seq_len=32, page_size=4)
    batch = Batch.build(cache, [[0, 1, 2]], [0], [12], logits="all")
    got = old_style(prompt, batch.positions(), batch)
    torch.testing.assert_close(got, _reference_logits(ref, prompt), atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
        ({"use_bidirectional_attention": True}, "embedding model"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        (
            {"layer_types": ["sliding_attention", "full_attention", "chunked_attention", "full_attention"]},
            "layer_types",
        ),
        ({"rope_parameters": {"full_attention": {"rope_type": "longrope", "factor": 4.0}}}, "'longrope'"),
        ({"hidden_activation": "mish7"}, "hidden_activation is 'mish7'"),
        ({"query_pre_attn_scalar": "big"}, "wrong type"),
    ],
)
def test_bad_configs_are_named(pair, tmp_path, changes, message):
    _, _, _, folder = pair
    config = {**json.loads((folder / "config.json").read_text()), **changes}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=message):
        Model.load(tmp_path, dtype=torch.float32)
