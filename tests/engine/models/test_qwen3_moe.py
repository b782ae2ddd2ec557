"""Qwen3-MoE against transformers on tiny random models saved with save_pretrained: which layers are sparse, float32
logits and greedy tokens, a sequence alone and in a ragged batch, chunked prefill, the experts under
transformers' 3-D parameter names, and configs the model refuses."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import save_file

from engine.cache import Cache
from engine.config.model import ModelConfig
from engine.errors import ModelLoadError
from engine.model_info import read_model_info
from engine.models import Batch, Model
from engine.models.layers import GatedMLP
from engine.models.moe import SparseMoE
from engine.models.qwen3_moe import Qwen3MoeForCausalLM

VOCAB = 211
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,  # the dense layers' MLP
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
CASES = {
    # one dense layer by name, the top-k weights renormalised (as in the released models)
    "mlp-only-layer": dict(mlp_only_layers=[1], norm_topk_prob=True),
    # every second layer sparse, the top-k weights left as the softmax gave them (transformers' default)
    "sparse-step": dict(decoder_sparse_step=2, norm_topk_prob=False, tie_word_embeddings=True),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    config = transformers.Qwen3MoeConfig(**BASE, **CASES[request.param])
    torch.manual_seed(3)
    hf = transformers.Qwen3MoeForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return request.param, hf, Model.load(folder, dtype=torch.float32), folder


def _prompts(sizes=(5, 23, 41), seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g) for n in sizes]


def _logits(model, prompts: list[torch.Tensor], page_size: int = 16) -> list[torch.Tensor]:
    """Each prompt's logits from one ragged batch of all of them (pages interleaved across sequences)."""
    cache = Cache(model, max_seq_len=page_size * 4 * len(prompts), page_size=page_size)
    tables = [[p * len(prompts) + i for p in range(4)] for i in range(len(prompts))]
    batch = Batch.build(cache, tables, [0] * len(prompts), [len(p) for p in prompts], logits="all")
    return list(model(torch.cat(prompts), batch.positions(), batch).split([len(p) for p in prompts]))


def test_the_sparse_layers_are_transformers(pair):
    name, hf, ours, _ = pair
    assert isinstance(ours, Qwen3MoeForCausalLM)
    kinds = [type(layer.mlp).__name__ for layer in hf.model.layers]
    assert [isinstance(layer.mlp, SparseMoE) for layer in ours.model.layers] == [
        k == "Qwen3MoeSparseMoeBlock" for k in kinds
    ], name
    assert all(isinstance(layer.mlp, (SparseMoE, GatedMLP)) for layer in ours.model.layers)
    assert 0 < sum(isinstance(layer.mlp, SparseMoE) for layer in ours.model.layers) < 4
    assert ours.moe.top_k == 2 and ours.moe.norm_topk_prob == hf.config.norm_topk_prob


def test_ragged_logits_match_transformers(pair):
    name, hf, ours, _ = pair
    prompts = _prompts()
    with torch.no_grad():
        for prompt, got in zip(prompts, _logits(ours, prompts)):
            ref = hf(prompt[None]).logits[0]
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4, msg=f"{name}: prompt of {len(prompt)}")


def test_greedy_tokens_match_transformers(pair):
    name, hf, ours, _ = pair
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
            assert generated[i] == ref[0, len(prompt) :].tolist(), f"{name}: prompt {i}"


def test_a_sequence_alone_and_in_a_ragged_batch_gives_the_same_logits(pair):
    """Routing is per token and drops none: the rows beside a sequence's change which experts run and on how
    many rows, never what its own tokens get (float32 matmuls of other row counts round alike to 1e-6 here)."""
    name, _, ours, _ = pair
    alone = _logits(ours, _prompts((29,), seed=5))[0]
    others = _prompts((3, 17, 40), seed=6)
    together = _logits(ours, [others[0], _prompts((29,), seed=5)[0], *others[1:]])[1]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5, msg=name)
    assert torch.equal(together.argmax(-1), alone.argmax(-1))


def test_chunked_prefill_equals_one_pass(pair):
    name, _, ours, _ = pair
    prompt = _prompts((37,), seed=7)[0]
    one_pass = _logits(ours, [prompt])[0]
    cache = Cache(ours, max_seq_len=64, page_size=16)
    chunks, past = [], 0
    for size in (11, 1, 16, 9):
        batch = Batch.build(cache, [[2, 0, 3]], [past], [size], logits="all")
        chunks.append(ours(prompt[past : past + size], batch.positions(), batch))
        past += size
    torch.testing.assert_close(torch.cat(chunks), one_pass, atol=1e-5, rtol=1e-5, msg=name)


def test_transformers_3d_expert_parameters_load_alike(pair, tmp_path):
    """A checkpoint of transformers' own parameters (experts as gate_up_proj [E, 2I, H] and down_proj [E, H, I])
    reads as the released per-expert one."""
    name, hf, ours, folder = pair
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    prompts = _prompts((13,), seed=8)
    got = _logits(Model.load(tmp_path, dtype=torch.float32), prompts)[0]
    torch.testing.assert_close(got, _logits(ours, prompts)[0], atol=0, rtol=0, msg=name)


def test_model_info_reads_the_folder(pair):
    _, hf, _, folder = pair
    info = read_model_info(folder)
    assert info.supported and info.engine_architecture == "Qwen3MoeForCausalLM"
    assert (info.num_layers, info.num_kv_heads, info.head_dim) == (4, 2, 16)


# Qwen/Qwen3-30B-A3B's config.json, as released.
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_the_released_30b_a3b_config_builds_as_transformers_reads_it():
    ours_config = ModelConfig.from_hf_dict(QWEN3_30B_A3B)
    theirs = transformers.Qwen3MoeConfig(**{k: v for k, v in QWEN3_30B_A3B.items() if k != "architectures"})
    with torch.device("meta"):
        ours = Qwen3MoeForCausalLM(ours_config)
    assert (ours.moe.num_experts, ours.moe.top_k, ours.moe.expert_size) == (
        theirs.num_experts,
        theirs.num_experts_per_tok,
        theirs.moe_intermediate_size,
    )
    assert ours.moe.norm_topk_prob and all(ours.moe.is_sparse) and len(ours.moe.is_sparse) == 48
    assert (ours_config.head_dim, ours_config.num_key_value_heads, ours_config.sliding_window) == (128, 4, None)
    assert ours_config.qk_norm and ours_config.rope_theta == 1e6
    experts = ours.model.layers[0].mlp.experts_gate_up
    assert tuple(experts.weight.shape) == (128, 2 * 768, 2048) and experts.weight.is_meta


@pytest.mark.parametrize("key", ["num_experts_per_tok", "moe_intermediate_size"])
def test_a_config_without_an_expert_key_is_refused_naming_it(pair, tmp_path, key):
    _, _, _, folder = pair
    config = json.loads((folder / "config.json").read_text())
    del config[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=key):
        Model.load(tmp_path, dtype=torch.float32)
