"""SmolLM3 against transformers on tiny random SmolLM3ForCausalLM models saved with save_pretrained: float32 logits
and greedy tokens with the default no-rope layers (every fourth) and with a list of our own, the no-rope layers
mattering, sliding windows on the layers `layer_types` names, a sequence alone and in a ragged batch, chunked
prefill; and the configs refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers

from engine.cache import Cache
from engine.errors import ModelLoadError
from engine.models import Batch, Model
from engine.models.smollm3 import SmolLM3ForCausalLM

VOCAB = 320  # the tiny_folder tokenizer's
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def _pair(folder, tiny_folder, seed: int = 3, **config):
    torch.manual_seed(seed)
    hf = transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(**SHAPE, **config)).eval()
    with torch.no_grad():  # norms are ones at init: make them count
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    hf.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_folder / name, folder / name)
    return hf, Model.load(folder, dtype=torch.float32), folder


@pytest.fixture(scope="module")
def default(tmp_path_factory, tiny_folder):
    """The released configs' kind: no rotary on every fourth layer (here the last), tied embeddings."""
    return _pair(tmp_path_factory.mktemp("smollm3"), tiny_folder)


@pytest.fixture(scope="module")
def listed(tmp_path_factory, tiny_folder):
    """No rotary on the first two layers (listed), and sliding windows of 8 on them (use_sliding_window)."""
    config = dict(no_rope_layers=[0, 0, 1, 1], use_sliding_window=True, sliding_window=8, tie_word_embeddings=False)
    return _pair(tmp_path_factory.mktemp("smollm3-listed"), tiny_folder, seed=4, **config)


def _prompts(sizes, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g) for n in sizes]


def _logits(model, prompts: list[torch.Tensor], page_size: int = 16) -> list[torch.Tensor]:
    cache = Cache(model, max_seq_len=page_size * 4 * len(prompts), page_size=page_size)
    tables = [[p * len(prompts) + i for p in range(4)] for i in range(len(prompts))]
    batch = Batch.build(cache, tables, [0] * len(prompts), [len(p) for p in prompts], logits="all")
    return list(model(torch.cat(prompts), batch.positions(), batch).split([len(p) for p in prompts]))


def _greedy(model, prompts: list[torch.Tensor], steps: int) -> list[list[int]]:
    rows = len(prompts)
    cache = Cache(model, max_seq_len=16 * 5 * rows, page_size=16)
    tables = [[p * rows + i for p in range(5)] for i in range(rows)]
    past, inputs, generated = [0] * rows, prompts, [[] for _ in prompts]
    for _ in range(steps):
        batch = Batch.build(cache, tables, past, [len(x) for x in inputs])
        next_ids = model(torch.cat(inputs), batch.positions(), batch).argmax(-1)
        past, inputs = list(batch.seq_lens_host), [next_ids[i : i + 1] for i in range(rows)]
        for i in range(rows):
            generated[i].append(int(next_ids[i]))
    return generated


def _hf_greedy(hf, prompt: torch.Tensor, steps: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(prompt[None], max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("which", ["default", "listed"])
def test_the_layers_are_transformers(request, which):
    hf, ours, _ = request.getfixturevalue(which)
    assert isinstance(ours, SmolLM3ForCausalLM)
    attns = [layer.self_attn for layer in ours.model.layers]
    hf_attns = [layer.self_attn for layer in hf.model.layers]
    assert [a.rotary for a in attns] == [bool(a.use_rope) for a in hf_attns]
    assert [a.sliding_window for a in attns] == [a.sliding_window for a in hf_attns]
    assert ours.config.rope_theta == 2_000_000.0  # SmolLM3Config's default_theta
    if which == "listed":
        assert [a.rotary for a in attns] == [False, False, True, True] and attns[0].sliding_window == 8


@pytest.mark.parametrize("which", ["default", "listed"])
def test_ragged_logits_and_greedy_tokens_match_transformers(request, which):
    hf, ours, _ = request.getfixturevalue(which)
    prompts = _prompts((5, 23, 41), seed=1)
    with torch.no_grad():
        for prompt, got in zip(prompts, _logits(ours, prompts)):
            torch.testing.assert_close(got, hf(prompt[None]).logits[0], atol=1e-4, rtol=1e-4, msg=f"{len(prompt)}")
    for i, tokens in enumerate(_greedy(ours, prompts, 16)):
        assert tokens == _hf_greedy(hf, prompts[i], 16), f"prompt {i}"


def test_the_no_rope_layers_matter(default):
    """Rotary on every layer gives other logits: the layer without it is what transformers computes."""
    _, ours, _ = default
    prompt = _prompts((30,), seed=2)[0]
    before = _logits(ours, [prompt])[0]
    last = ours.model.layers[-1].self_attn
    try:
        last.rotary = True
        assert (_logits(ours, [prompt])[0] - before).abs().max() > 0.1
    finally:
        last.rotary = False


def test_a_sequence_alone_and_in_a_ragged_batch_and_in_chunks_gives_the_same_logits(listed):
    _, ours, _ = listed
    prompt = _prompts((37,), seed=5)[0]
    alone = _logits(ours, [prompt])[0]
    others = _prompts((3, 17, 40), seed=6)
    torch.testing.assert_close(_logits(ours, [others[0], prompt, *others[1:]])[1], alone, atol=1e-5, rtol=1e-5)
    cache = Cache(ours, max_seq_len=64, page_size=16)
    chunks, past = [], 0
    for size in (11, 1, 16, 9):
        batch = Batch.build(cache, [[2, 0, 3]], [past], [size], logits="all")
        chunks.append(ours(prompt[past : past + size], batch.positions(), batch))
        past += size
    torch.testing.assert_close(torch.cat(chunks), alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"no_rope_layers": [1, 1, 0]}, "'no_rope_layers'"),
        ({"no_rope_layers": [1, 1, 2, 0]}, "'no_rope_layers'"),
        ({"no_rope_layers": None, "no_rope_layer_interval": 0}, "'no_rope_layer_interval'"),
        ({"layer_types": ["full_attention"] * 3 + ["chunked_attention"]}, "'layer_types'"),
    ],
    ids=["too few flags", "a flag not 0 or 1", "an interval of 0", "an unknown layer type"],
)
def test_bad_configs_are_named(default, tmp_path, change, message):
    _, _, folder = default
    config = {**json.loads((folder / "config.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=message):
        Model.load(tmp_path, dtype=torch.float32)
