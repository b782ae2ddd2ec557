"""Every text architecture against `transformers`: ragged-batch logits and greedy tokens, over paged KV."""

from __future__ import annotations

import pytest
import torch
import transformers

from engine.cache import Cache
from engine.models import Batch, Model

VOCAB = 211


def _hf_config(arch: str, **over):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=80,
        intermediate_size=136,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    base.update(over)
    cls = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[arch]
    return cls(**base)


CASES = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-bias": ("llama", {"attention_bias": True}),
    "llama3-rope": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "llama-linear-rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "mistral-window": ("mistral", {"sliding_window": 7, "num_key_value_heads": 1}),
    "qwen2": ("qwen2", {"num_key_value_heads": 4}),
    "qwen3": ("qwen3", {"head_dim": 24}),
}

MODEL_CLASSES = {
    "llama": transformers.LlamaForCausalLM,
    "mistral": transformers.MistralForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    arch, over = CASES[request.param]
    torch.manual_seed(hash(request.param) % 1000)
    hf = MODEL_CLASSES[arch](_hf_config(arch, **over)).eval()
    folder = tmp_path_factory.mktemp(request.param)
    # The tied case is also saved sharded, so the index path is exercised.
    hf.save_pretrained(folder, max_shard_size="40KB" if "tied" in request.param else "1GB")
    ours = Model.load(folder, dtype=torch.float32)
    return request.param, hf, ours


def _prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, VOCAB, (n,), generator=g) for n in (5, 23, 41)]


def _pages(num_seqs: int, tokens: int, page_size: int) -> list[list[int]]:
    per = (tokens + page_size - 1) // page_size
    # Interleave page ids across sequences so a wrong block table lookup cannot go unnoticed.
    return [[p * num_seqs + i for p in range(per)] for i in range(num_seqs)]


@pytest.mark.parametrize("page_size", [16, 256])
def test_ragged_logits_match(pair, page_size):
    name, hf, ours = pair
    prompts = _prompts()
    cache = Cache(ours, max_seq_len=page_size * 3 * 4, page_size=page_size)
    tables = _pages(3, 64, page_size)
    batch = Batch.build(cache, tables, [0, 0, 0], [len(p) for p in prompts], logits="all")
    logits = ours(torch.cat(prompts), batch.positions(), batch)
    start = 0
    with torch.no_grad():
        for p in prompts:
            ref = hf(p[None]).logits[0]
            got = logits[start : start + len(p)]
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4, msg=f"{name}: prompt of {len(p)}")
            start += len(p)


@pytest.mark.parametrize("page_size", [16, 256])
def test_greedy_tokens_match(pair, page_size):
    name, hf, ours = pair
    prompts = _prompts()
    steps = 32
    cache = Cache(ours, max_seq_len=page_size * 3 * 6, page_size=page_size)
    tables = _pages(3, 41 + steps, page_size)
    past = [0, 0, 0]
    inputs = prompts
    generated: list[list[int]] = [[], [], []]
    for _ in range(steps):
        batch = Batch.build(cache, tables, past, [len(x) for x in inputs])
        next_ids = ours(torch.cat(inputs), batch.positions(), batch).argmax(-1)
        past = list(batch.seq_lens_host)
        inputs = [next_ids[i : i + 1] for i in range(3)]
        for i in range(3):
            generated[i].append(int(next_ids[i]))
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ref = hf.generate(p[None], max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
            assert generated[i] == ref[0, len(p) :].tolist(), f"{name}: prompt {i}"
