"""YaRN rope scaling against transformers: the inverse frequencies and the attention factor of several yarn
configs, the cos/sin tables of Llama, Gemma 3 (global layers) and Qwen2-VL (M-RoPE), and tiny Llama and Qwen3
models read from their saved folders, whose logits and greedy tokens run past the original context."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import _compute_yarn_parameters

from engine.cache import Cache
from engine.config.model import ModelConfig
from engine.errors import ModelLoadError
from engine.models import Batch, Model
from engine.models.registry import model_class
from engine.models.rope import RotaryTable, inverse_frequencies

# Each case: (head_dim, rope_theta, max_position_embeddings, the yarn keys).
YARN = {
    # Qwen3's long-context config: defaults for everything but the factor and the original context.
    "factor-4": (64, 10000.0, 16384, {"factor": 4.0, "original_max_position_embeddings": 4096}),
    # gpt-oss: the ramp's ends are not rounded to whole dimensions.
    "factor-32-untruncated": (
        64,
        150000.0,
        131072,
        {
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
    ),
    "attention-factor-and-betas": (
        48,
        10000.0,
        16384,
        {
            "factor": 8.0,
            "original_max_position_embeddings": 2048,
            "attention_factor": 0.9,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
        },
    ),
    # DeepSeek / Ministral 3: the attention factor is a ratio of two magnitudes.
    "mscale": (
        64,
        10000.0,
        163840,
        {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.707},
    ),
    # A null factor is max_position_embeddings / original_max_position_embeddings.
    "null-factor": (32, 10000.0, 8192, {"factor": None, "original_max_position_embeddings": 2048}),
}


def _llama_config(head_dim: int, theta: float, max_positions: int, yarn: dict) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=2 * head_dim,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "yarn", "rope_theta": theta, **yarn},
    )


def _ours(hf_config: transformers.LlamaConfig) -> ModelConfig:
    return ModelConfig.from_hf_dict({**hf_config.to_dict(), "architectures": ["LlamaForCausalLM"]})


@pytest.mark.parametrize("case", sorted(YARN))
def test_frequencies_and_attention_factor_match_transformers(case):
    hf_config = _llama_config(*YARN[case])
    ref_inv, ref_factor = _compute_yarn_parameters(hf_config)
    config = _ours(hf_config)
    torch.testing.assert_close(inverse_frequencies(config), ref_inv, rtol=1e-6, atol=0)
    assert config.rope_scaling.attention_factor == pytest.approx(ref_factor, rel=1e-12)


def test_truncation_moves_the_ramp():
    head_dim, theta, max_positions, yarn = YARN["factor-32-untruncated"]
    untruncated = _ours(_llama_config(head_dim, theta, max_positions, yarn))
    truncated = _ours(_llama_config(head_dim, theta, max_positions, {**yarn, "truncate": True}))
    assert not torch.equal(inverse_frequencies(untruncated), inverse_frequencies(truncated))


@pytest.mark.parametrize("case", sorted(YARN))
def test_cos_sin_match_llamas_rotary_embedding(case):
    hf_config = _llama_config(*YARN[case])
    positions = torch.arange(300)
    ref_cos, ref_sin = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(hf_config)(
        torch.zeros(1, 1, dtype=torch.float32), positions[None]
    )
    cos, sin = RotaryTable.for_config(_ours(hf_config)).lookup(positions, len(positions), torch.float32)
    # Angles up to ~300 rad: one float32 step of an inverse frequency moves them by ~2e-5.
    torch.testing.assert_close(cos, ref_cos[0], rtol=0, atol=5e-5)
    torch.testing.assert_close(sin, ref_sin[0], rtol=0, atol=5e-5)


SMALL_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
SHAPE = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
)


def _meta_model(hf_config, architecture: str):
    config = ModelConfig.from_hf_dict({**hf_config.to_dict(), "architectures": [architecture]})
    with torch.device("meta"):
        return model_class(config.architecture)(config)


def test_gemma3_global_layers_take_the_yarn_factor():
    hf_config = transformers.Gemma3TextConfig(
        **SHAPE,
        head_dim=16,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {**SMALL_YARN, "rope_theta": 5000.0},
        },
    )
    ours = _meta_model(hf_config, "Gemma3ForCausalLM")
    rotary = transformers.Gemma3ForCausalLM(hf_config).model.rotary_emb
    positions = torch.arange(100)
    for layer_type, table in (("full_attention", ours.rope), ("sliding_attention", ours.local_rope)):
        ref_cos, ref_sin = rotary(torch.zeros(1, 1), positions[None], layer_type)
        cos, sin = table.lookup(positions, len(positions), torch.float32)
        torch.testing.assert_close(cos, ref_cos[0], rtol=0, atol=1e-5, msg=layer_type)
        torch.testing.assert_close(sin, ref_sin[0], rtol=0, atol=1e-5, msg=layer_type)
    assert ours.rope.attention_factor > 1 and ours.local_rope.attention_factor == 1


def test_qwen2_vl_mrope_takes_the_yarn_factor():
    hf_config = transformers.Qwen2VLConfig(
        text_config={**SHAPE, "rope_parameters": {**SMALL_YARN, "mrope_section": [2, 3, 3], "rope_theta": 100.0}},
        vision_config=dict(depth=1, embed_dim=32, num_heads=2, hidden_size=64),
    )
    ours = _meta_model(hf_config, "Qwen2VLForConditionalGeneration")
    rotary = transformers.Qwen2VLForConditionalGeneration(hf_config).model.language_model.rotary_emb
    # Three rows that differ, so each band's row is checked, not just the factor.
    positions = torch.stack([torch.arange(50), torch.arange(50) // 2, torch.arange(50) % 7])  # [3, num_tokens]
    ref_cos, ref_sin = rotary(torch.zeros(1, 1), positions[:, None])
    cos, sin = ours.language_model.rope.lookup(positions, 50, torch.float32)
    torch.testing.assert_close(cos, ref_cos[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(sin, ref_sin[0], rtol=0, atol=1e-5)
    assert ours.language_model.rope.attention_factor == pytest.approx(rotary.attention_scaling)


# Tiny models whose original context (32) the prompts and replies run well past.
MODELS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, SMALL_YARN),
    "qwen3-untruncated": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        {**SMALL_YARN, "factor": 8.0, "truncate": False, "attention_factor": 1.25, "beta_fast": 16.0, "beta_slow": 2.0},
    ),
}
PROMPT, STEPS, CONTEXT = 100, 20, 128


@pytest.fixture(scope="module", params=sorted(MODELS))
def pair(request, tmp_path_factory):
    config_cls, model_cls, yarn = MODELS[request.param]
    hf_config = config_cls(
        **{**SHAPE, "vocab_size": 211, "max_position_embeddings": int(32 * yarn["factor"])},
        head_dim=16,
        rms_norm_eps=1e-5,
        initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
        pad_token_id=0,
        tie_word_embeddings=False,
        rope_parameters={**yarn, "rope_theta": 100.0},  # a small theta: many frequencies turn within 32
    )
    torch.manual_seed(3)
    hf = model_cls(hf_config).eval()
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return request.param, hf, Model.load(folder, dtype=torch.float32)


def _prompt() -> torch.Tensor:
    return torch.randint(3, 211, (PROMPT,), generator=torch.Generator().manual_seed(5))


def test_logits_past_the_original_context_match_transformers(pair):
    name, hf, ours = pair
    assert ours.config.rope_scaling.rope_type == "yarn"
    assert ours.rope.attention_factor == pytest.approx(hf.model.rotary_emb.attention_scaling)
    ids = _prompt()
    cache = Cache(ours, max_seq_len=CONTEXT, page_size=16)
    batch = Batch.build(cache, [list(range(cache.num_pages))], [0], [PROMPT], logits="all")
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    torch.testing.assert_close(ours(ids, batch.positions(), batch), ref, atol=1e-4, rtol=1e-4, msg=name)


def test_greedy_tokens_past_the_original_context_match_transformers(pair):
    name, hf, ours = pair
    ids = _prompt()
    cache = Cache(ours, max_seq_len=CONTEXT, page_size=16)
    table = [list(range(cache.num_pages))]
    past, inputs, generated = 0, ids, []
    for _ in range(STEPS):
        batch = Batch.build(cache, table, [past], [len(inputs)])
        inputs = ours(inputs, batch.positions(), batch).argmax(-1)
        past = batch.seq_lens_host[0]
        generated.append(int(inputs[0]))
    with torch.no_grad():
        ref = hf.generate(ids[None], max_new_tokens=STEPS, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert generated == ref[0, PROMPT:].tolist(), name


def test_yarn_without_a_factor_names_the_key():
    d = _llama_config(*YARN["factor-4"]).to_dict()
    del d["rope_parameters"]["factor"]
    with pytest.raises(ModelLoadError, match="'yarn' has no 'factor'"):
        ModelConfig.from_hf_dict({**d, "architectures": ["LlamaForCausalLM"]})
