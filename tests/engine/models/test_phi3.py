"""Phi-3 / Phi-4 against transformers on tiny random Phi3ForCausalLM models saved with save_pretrained: float32
logits and greedy tokens of a Phi-4-mini-like model (partial rotary, LongRoPE with an original context of 32,
tied embeddings): in a cache of 32 tokens (the short factors) and in longer ones on prompts past 32 (the long
factors), alone and in ragged batches; a phi-4-like model with a sliding window; and the configs refused."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import transformers

from engine.cache import Cache
from engine.errors import ModelLoadError
from engine.models import Batch, Model
from engine.models.phi3 import Phi3ForCausalLM
from engine.models.rope import LongRopeTable, RotaryTable

VOCAB = 320  # the tiny_folder tokenizer's
ORIGINAL = 32
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # heads of 32
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def _longrope(rotary: int, g: torch.Generator) -> dict:
    half = rotary // 2
    return dict(
        type="longrope",
        short_factor=(1 + 0.5 * torch.rand(half, generator=g)).tolist(),
        long_factor=(1 + 7 * torch.rand(half, generator=g)).tolist(),
    )


def _pair(folder, tiny_folder, **config):
    torch.manual_seed(7)
    hf = transformers.Phi3ForCausalLM(transformers.Phi3Config(**SHAPE, **config)).eval()
    with torch.no_grad():  # norms are ones at init: make them count
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    hf.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_folder / name, folder / name)
    return hf, Model.load(folder, dtype=torch.float32)


@pytest.fixture(scope="module")
def mini(tmp_path_factory, tiny_folder):
    """Phi-4-mini's kind: 24 of 32 dimensions rotated, LongRoPE stretching 32 positions to 256, tied head."""
    g = torch.Generator().manual_seed(1)
    config = dict(
        partial_rotary_factor=0.75,
        max_position_embeddings=256,
        original_max_position_embeddings=ORIGINAL,
        rope_scaling=_longrope(24, g),
        tie_word_embeddings=True,
    )
    folder = tmp_path_factory.mktemp("phi4-mini")
    return (*_pair(folder, tiny_folder, **config), folder)


@pytest.fixture(scope="module")
def windowed(tmp_path_factory, tiny_folder):
    """phi-4's kind (whole heads rotated, no scaling), with a sliding window of 8 as Phi-3-mini-4k has one."""
    folder = tmp_path_factory.mktemp("phi3-window")
    return _pair(folder, tiny_folder, sliding_window=8, max_position_embeddings=512)


def _prompts(sizes, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g) for n in sizes]


def _logits(model, prompts: list[torch.Tensor], pages: int = 5, page_size: int = 16) -> list[torch.Tensor]:
    """Each prompt's logits from one ragged batch of all of them (pages interleaved across sequences), in a cache
    of `pages` pages per prompt."""
    cache = Cache(model, max_seq_len=page_size * pages * len(prompts), page_size=page_size)
    tables = [[p * len(prompts) + i for p in range(pages)] for i in range(len(prompts))]
    batch = Batch.build(cache, tables, [0] * len(prompts), [len(p) for p in prompts], logits="all")
    return list(model(torch.cat(prompts), batch.positions(), batch).split([len(p) for p in prompts]))


def _greedy(model, prompts: list[torch.Tensor], steps: int, pages: int = 5) -> list[list[int]]:
    """Greedy tokens of all prompts decoded together, one token per sequence per step."""
    rows = len(prompts)
    cache = Cache(model, max_seq_len=16 * pages * rows, page_size=16)
    tables = [[p * rows + i for p in range(pages)] for i in range(rows)]
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


def test_the_config_is_read_as_transformers_reads_it(mini):
    hf, ours, _ = mini
    assert isinstance(ours, Phi3ForCausalLM) and ours.config.rotary_dim == 24
    assert isinstance(ours.rope, LongRopeTable) and ours.rope.original == ORIGINAL
    assert ours.rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(8) / math.log(32)))
    assert ours.rope.attention_factor == pytest.approx(hf.model.rotary_emb.attention_scaling)
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.table.data_ptr()  # tied


@pytest.mark.parametrize("size", [5, 20, 32])
def test_a_cache_within_the_original_context_takes_the_short_factors(mini, size):
    """A cache of 32 tokens (two pages) never holds a sequence past the original context: transformers' numbers."""
    hf, ours, _ = mini
    prompt = _prompts((size,), seed=size)[0]
    with torch.no_grad():
        torch.testing.assert_close(
            _logits(ours, [prompt], pages=2)[0], hf(prompt[None]).logits[0], atol=1e-4, rtol=1e-4
        )
    if size < 32:
        assert _greedy(ours, [prompt], 32 - size, pages=2)[0] == _hf_greedy(hf, prompt, 32 - size)


@pytest.mark.parametrize("sizes", [(33,), (40, 50, 33), (79, 36)])
def test_ragged_logits_past_the_original_context_match_transformers(mini, sizes):
    hf, ours, _ = mini
    prompts = _prompts(sizes, seed=len(sizes))
    with torch.no_grad():
        for prompt, got in zip(prompts, _logits(ours, prompts)):
            ref = hf(prompt[None]).logits[0]
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4, msg=f"prompt of {len(prompt)}")


def test_greedy_tokens_past_the_original_context_match_transformers(mini):
    hf, ours, _ = mini
    prompts, steps = _prompts((34, 45, 40), seed=4), 20
    for i, tokens in enumerate(_greedy(ours, prompts, steps)):
        assert tokens == _hf_greedy(hf, prompts[i], steps), f"prompt {i}"


def test_the_long_factors_matter_and_a_long_cache_takes_them_for_every_sequence(mini):
    """A short prompt in a cache that can grow past 32 takes the long factors from its first token, so its keys
    stay valid as it grows (transformers would recompute them at the crossing)."""
    _, ours, _ = mini
    prompt = _prompts((20,), seed=3)[0]
    short, long = _logits(ours, [prompt], pages=2)[0], _logits(ours, [prompt], pages=3)[0]
    assert (long - short).abs().max() > 0.1
    kept = ours.rope.long
    try:
        ours.rope.long = RotaryTable(ours.rope.inv_freq, ours.rope.attention_factor)  # the short set
        torch.testing.assert_close(_logits(ours, [prompt], pages=3)[0], short, atol=1e-6, rtol=1e-6)
    finally:
        ours.rope.long = kept


def test_chunked_prefill_across_the_original_context_equals_one_pass(mini):
    _, ours, _ = mini
    prompt = _prompts((60,), seed=9)[0]
    one_pass = _logits(ours, [prompt])[0]
    cache = Cache(ours, max_seq_len=80, page_size=16)
    chunks, past = [], 0
    for size in (20, 1, 15, 24):
        batch = Batch.build(cache, [[2, 0, 4, 1]], [past], [size], logits="all")
        chunks.append(ours(prompt[past : past + size], batch.positions(), batch))
        past += size
    torch.testing.assert_close(torch.cat(chunks), one_pass, atol=1e-5, rtol=1e-5)


def test_the_sliding_window_matches_transformers(windowed):
    hf, ours = windowed
    assert all(layer.self_attn.sliding_window == 8 for layer in ours.model.layers)
    assert ours.config.rotary_dim == 32 and not isinstance(ours.rope, LongRopeTable)
    prompts = _prompts((6, 30, 19), seed=8)
    with torch.no_grad():
        for prompt, got in zip(prompts, _logits(ours, prompts)):
            torch.testing.assert_close(got, hf(prompt[None]).logits[0], atol=1e-4, rtol=1e-4)
    for i, tokens in enumerate(_greedy(ours, prompts, 12)):
        assert tokens == _hf_greedy(hf, prompts[i], 12), f"prompt {i}"


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c["rope_parameters"].pop("long_factor"), "'long_factor'"),
        (lambda c: c["rope_parameters"].update(short_factor=[1.0] * 5), "a rotary of 24 dimensions has 12"),
        (lambda c: c["rope_parameters"].update(short_factor=[1.0, -2.0] * 6), "'short_factor'"),
        (lambda c: c.update(partial_rotary_factor=1.5, rope_parameters={"rope_type": "default"}), "rotary"),
    ],
    ids=["no long factors", "factors of the wrong length", "a negative factor", "a rotary past the head"],
)
def test_bad_longrope_configs_are_named(mini, tmp_path, change, message):
    _, _, folder = mini
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=message):
        Model.load(tmp_path, dtype=torch.float32)
