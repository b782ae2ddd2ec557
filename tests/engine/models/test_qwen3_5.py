"""Qwen3.5 (dense, text) against transformers on a tiny random model saved with save_pretrained: both layer types,
float32 prompt logits, greedy tokens through the generator (jobs alone, together, in small prefill chunks, more
jobs than state slots), a banned-string rewind, the memory its card counts, what is refused (damaged
linear-attention tensors, a state budget too small for one sequence). Prefix reuse and rewinds from state
snapshots: tests/engine/generator/test_hybrid_prefix.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from engine import Cache, DynamicGenerator, DynamicJob, SamplerSettings
from engine.errors import ModelLoadError
from engine.models import Batch, Model
from engine.models.qwen3_5 import Qwen3_5ForCausalLM


def _load(name: str, path: Path):
    # conftest is not importable as a package under --import-mode=importlib.
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_tiny = _load("qwen3_5_tests_conftest", Path(__file__).resolve().parents[2] / "conftest.py").build_tiny

PAGE = 16
NEW_TOKENS = 10
GREEDY = SamplerSettings.greedy()
LAYER_TYPES = ["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"]


def _config(vocab_size: int, **over) -> transformers.Qwen3_5TextConfig:
    base = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=len(LAYER_TYPES),
        layer_types=LAYER_TYPES,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,  # two value heads per key head
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return transformers.Qwen3_5TextConfig(**{**base, **over})


def build_tiny_qwen3_5(folder: Path, **over) -> Path:
    """The tiny tokenizer's folder with a random Qwen3.5 model saved over its weights (`over`: config changes)."""
    vocab = build_tiny(folder).config.vocab_size
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForCausalLM(_config(vocab, **over)).eval()
    with torch.no_grad():  # transformers starts these at constants; move them so every weight's role is checked
        for name, param in hf.named_parameters():
            if "norm" in name or "A_log" in name or "dt_bias" in name:
                param.add_(torch.randn_like(param) * 0.3)
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_qwen3_5(tmp_path_factory.mktemp("tiny-qwen3_5"))


@pytest.fixture(scope="module")
def hf(folder):
    return transformers.Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model(folder):
    return Model.load(folder, dtype=torch.float32)


def _prompts(model, sizes, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, model.config.vocab_size, (n,), generator=gen).tolist() for n in sizes]


def _run(model, prompts, pages: int = 40, **options) -> list[list[int]]:
    """Each prompt's greedy tokens, all enqueued at once."""
    state_bytes = options.pop("state_bytes", None)
    cache = Cache(model, max_seq_len=pages * PAGE, page_size=PAGE, state_bytes=state_bytes)
    generator = DynamicGenerator(model, cache, model.tokenizer, **options)
    jobs = [DynamicJob(ids, max_new_tokens=NEW_TOKENS, stop_conditions=[], gen_settings=GREEDY) for ids in prompts]
    generator.enqueue(jobs)
    tokens: dict[int, list[int]] = {id(job): [] for job in jobs}
    while generator.num_remaining_jobs():
        for result in generator.iterate():
            if "token_ids" in result:
                tokens[id(result["job"])] += result["token_ids"].flatten().tolist()
    assert generator.cache_manager.states.num_free == cache.state.num_slots  # every slot given back
    return [tokens[id(job)] for job in jobs]


def _reference(hf, prompts) -> list[list[int]]:
    with torch.no_grad():
        return [
            hf.generate(
                torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, len(p) :].tolist()
            for p in prompts
        ]


def test_layers_follow_layer_types_and_keep_state_not_pages(model):
    assert isinstance(model, Qwen3_5ForCausalLM)
    assert [layer.is_linear for layer in model.model.layers] == [t == "linear_attention" for t in LAYER_TYPES]
    cache = Cache(model, max_seq_len=4 * PAGE, page_size=PAGE)
    linear = {i for i, t in enumerate(LAYER_TYPES) if t == "linear_attention"}
    assert cache.state_layers == linear
    assert [cache.k[i].shape[0] for i in range(len(LAYER_TYPES))] == [0 if i in linear else 4 for i in range(5)]
    assert tuple(cache.state.conv[0].shape) == (cache.state.num_slots, 2 * 2 * 8 + 4 * 12, 3)
    assert tuple(cache.state.delta[0].shape) == (cache.state.num_slots, 4, 8, 12)


def test_prompt_logits_match_transformers(model, hf):
    """A ragged batch of prompts shorter and longer than the delta rule's 64-token chunk."""
    prompts = _prompts(model, (5, 70, 130))
    cache = Cache(model, max_seq_len=PAGE * 9 * 3, page_size=PAGE)
    tables = [[p * 3 + i for p in range(9)] for i in range(3)]
    batch = Batch.build(cache, tables, [0] * 3, [len(p) for p in prompts], logits="all")
    ids = torch.tensor([t for p in prompts for t in p])
    got = model(ids, batch.positions(), batch).split([len(p) for p in prompts])
    with torch.no_grad():
        for prompt, logits in zip(prompts, got):
            ref = hf(torch.tensor([prompt])).logits[0]
            torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4, msg=f"prompt of {len(prompt)}")


def test_greedy_tokens_match_transformers_alone_and_together(model, hf):
    prompts = _prompts(model, (7, 45), seed=1)
    together = _run(model, prompts)
    assert together == _reference(hf, prompts)
    assert [_run(model, [p])[0] for p in prompts] == together


def test_chunked_prefill_gives_the_same_tokens(model, hf):
    prompts = _prompts(model, (30, 71), seed=2)
    assert _run(model, prompts, max_chunk_size=5) == _reference(hf, prompts)


def test_jobs_wait_for_a_state_slot(model):
    """A pool of one live slot runs three jobs one after another, each as it runs alone."""
    prompts = _prompts(model, (9, 20, 4), seed=3)
    one_slot = Cache(model, max_seq_len=PAGE, page_size=PAGE).state.bytes_per_slot
    assert _run(model, prompts, state_bytes=one_slot) == _run(model, prompts)


def test_a_banned_string_rewind_recomputes_the_state(model, hf):
    """Banning the text of a greedy token (the first after two whose text is whole and new) makes the job take
    transformers' next best there: the rewind recomputed the state before it."""
    prompt = _prompts(model, (12,), seed=4)[0]
    plain = _reference(hf, [prompt])[0]
    tokenizer = model.tokenizer

    def text(ids):
        return tokenizer.decode(torch.tensor(ids))

    k = next(
        i
        for i in range(2, len(plain))
        if text([plain[i]]).strip().isalpha() and text([plain[i]]) not in text(plain[:i])
    )
    banned = text([plain[k]])
    cache = Cache(model, max_seq_len=8 * PAGE, page_size=PAGE)
    generator = DynamicGenerator(model, cache, tokenizer)
    job = DynamicJob(prompt, max_new_tokens=k + 1, stop_conditions=[], gen_settings=GREEDY, banned_strings=[banned])
    generator.enqueue(job)
    tokens = []
    while generator.num_remaining_jobs():
        for result in generator.iterate():
            if "token_ids" in result:
                tokens += result["token_ids"].flatten().tolist()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + plain[:k]])).logits[0, -1]
    logits[plain[k]] = float("-inf")
    assert tokens == plain[:k] + [int(logits.argmax())]


def test_the_card_counts_the_state_pool_and_no_pages_for_linear_layers(folder, model):
    """memory_need's cache bytes are a real Cache's: pages for the two full-attention layers only, and the default
    pool of live and snapshot state slots."""
    from engine.memory_fit import CONTEXT_STEP, memory_need, recurrent_state_bytes
    from engine.model_info import read_model_info

    info = read_model_info(folder)
    assert (info.num_layers, info.num_linear_layers) == (5, 3)
    for tokens in (CONTEXT_STEP, 8 * CONTEXT_STEP):
        cache = Cache(model, tokens, page_size=CONTEXT_STEP)
        assert memory_need(info, tokens, 4).kv_bytes == cache.num_bytes
    assert recurrent_state_bytes(info, 4) == cache.state.num_bytes
    pages_only = cache.num_bytes - cache.state.num_bytes
    assert pages_only == 2 * 2 * 2 * 16 * 4 * 8 * CONTEXT_STEP  # K and V, 2 layers, 2 heads of 16, float32


def test_a_state_budget_below_one_sequence_is_refused(model):
    with pytest.raises(ValueError, match="state_bytes"):
        Cache(model, max_seq_len=4 * PAGE, page_size=PAGE, state_bytes=100)


@pytest.mark.parametrize(
    ("tensor", "change"),
    [
        ("model.layers.0.linear_attn.A_log", "drop"),
        ("model.layers.1.linear_attn.conv1d.weight", "squeeze"),
        ("model.layers.3.linear_attn.dt_bias", "grow"),
    ],
)
def test_damaged_linear_attention_tensors_are_refused_by_name(folder, tmp_path, tensor, change):
    for item in folder.iterdir():
        if item.is_file():
            shutil.copy(item, tmp_path / item.name)
    tensors = load_file(tmp_path / "model.safetensors")
    if change == "drop":
        del tensors[tensor]
    elif change == "squeeze":
        tensors[tensor] = tensors[tensor][:, 0].contiguous()  # [conv_dim, kernel], not [conv_dim, 1, kernel]
    else:
        tensors[tensor] = torch.cat((tensors[tensor], tensors[tensor][:1]))
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=tensor.replace(".", r"\.")):
        Model.load(tmp_path, dtype=torch.float32)


def test_without_layer_types_every_fourth_layer_is_full_attention(tmp_path):
    hf = transformers.Qwen3_5ForCausalLM(_config(64, layer_types=None, num_hidden_layers=8))
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["layer_types"]  # transformers writes the list it derived; older files may leave it out
    (tmp_path / "config.json").write_text(json.dumps(config))
    ours = Model.load(tmp_path, dtype=torch.float32)
    assert [layer.is_linear for layer in ours.model.layers] == [t == "linear_attention" for t in hf.config.layer_types]
    assert [layer.is_linear for layer in ours.model.layers] == [True, True, True, False] * 2
