"""The self-speculation draft (engine/models/layer_skip.py) on a 4-layer tiny Llama: it shares the full model's
weights, computes what transformers computes for the same model cut to k layers, and as a draft it leaves
greedy output unchanged.

Bad inputs tried: 0 layers, all 4 layers, 5 layers, True, "2", and a model without decoder layers.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Batch, Model
from engine.models.layer_skip import truncated_draft

NUM_LAYERS, DRAFT_LAYERS = 4, 2
PAGE_SIZE = 16


@pytest.fixture(scope="module")
def deep_folder(tiny_folder, tmp_path_factory):
    """The tiny tokenizer with a 4-layer random Llama (the shared tiny model has only 2 layers)."""
    folder = tmp_path_factory.mktemp("tiny-deep")
    shutil.copytree(tiny_folder, folder, dirs_exist_ok=True)
    config = transformers.LlamaConfig.from_pretrained(tiny_folder)
    config.num_hidden_layers = NUM_LAYERS
    torch.manual_seed(4)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def deep(deep_folder):
    return Model.load(deep_folder, dtype=torch.float32)


def test_draft_shares_every_weight_and_keeps_k_layers(deep):
    draft = truncated_draft(deep, DRAFT_LAYERS)
    full_storage = {p.untyped_storage().data_ptr() for p in deep.parameters()}
    draft_params = list(draft.parameters())
    assert draft_params and all(p.untyped_storage().data_ptr() in full_storage for p in draft_params)
    assert all(a is b for a, b in zip(draft.model.layers, deep.model.layers[:DRAFT_LAYERS], strict=True))
    assert draft.lm_head is deep.lm_head and draft.model.norm is deep.model.norm
    assert draft.model.embed_tokens is deep.model.embed_tokens
    assert len(draft.model.layers) == draft.config.num_hidden_layers == DRAFT_LAYERS
    # The full model is untouched.
    assert len(deep.model.layers) == deep.config.num_hidden_layers == NUM_LAYERS
    assert draft.tokenizer is deep.tokenizer
    assert len(Cache(draft, max_seq_len=64, page_size=PAGE_SIZE).k) == DRAFT_LAYERS


def test_draft_logits_match_transformers_cut_to_k_layers(deep, deep_folder):
    draft = truncated_draft(deep, DRAFT_LAYERS)
    # transformers builds DRAFT_LAYERS layers and loads the first ones from the checkpoint (the rest unused).
    hf = transformers.LlamaForCausalLM.from_pretrained(deep_folder, num_hidden_layers=DRAFT_LAYERS).eval()
    prompt = torch.randint(3, deep.config.vocab_size, (23,), generator=torch.Generator().manual_seed(0))
    cache = Cache(draft, max_seq_len=2 * PAGE_SIZE, page_size=PAGE_SIZE)
    batch = Batch.build(cache, [[0, 1]], [0], [len(prompt)], logits="all")
    got = draft(prompt, batch.positions(), batch)
    with torch.no_grad():
        ref = hf(prompt[None]).logits[0]
        full = deep(prompt, batch.positions(), Batch.build(Cache(deep, 32, PAGE_SIZE), [[0, 1]], [0], [23], "all"))
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(got, full, atol=1e-2), "the draft must differ from the full model"


def _greedy(model, prompts, **gen_kw) -> list[dict]:
    cache = Cache(model, max_seq_len=32 * PAGE_SIZE, page_size=PAGE_SIZE)
    gen = DynamicGenerator(model, cache, model.tokenizer, **gen_kw)
    jobs = [DynamicJob(p, 20, gen_settings=SamplerSettings.greedy(), identifier=i) for i, p in enumerate(prompts)]
    gen.enqueue(jobs)
    ids: dict[int, list[int]] = {i: [] for i in range(len(jobs))}
    eos: dict[int, dict] = {}
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if "token_ids" in r:
                ids[r["identifier"]] += r["token_ids"][0].tolist()
            if r["eos"]:
                eos[r["identifier"]] = r
    return [{"ids": ids[i], **eos[i]} for i in range(len(jobs))]


def test_as_draft_model_greedy_output_is_unchanged(deep):
    prompts = [deep.tokenizer.encode_ids(t) for t in ("The quick brown fox", "def add(a, b):\n", "One two three")]
    plain = _greedy(deep, prompts)
    draft = truncated_draft(deep, DRAFT_LAYERS)
    draft_cache = Cache(draft, max_seq_len=32 * PAGE_SIZE, page_size=PAGE_SIZE)
    spec = _greedy(deep, prompts, draft_model=draft, draft_cache=draft_cache, num_draft_tokens=4)
    drafted = 0
    for p, s in zip(plain, spec, strict=True):
        assert s["ids"] == p["ids"] and s["full_completion"] == p["full_completion"]
        drafted += s["accepted_draft_tokens"] + s["rejected_draft_tokens"]
    assert drafted > 0, "the draft was never asked for tokens"


@pytest.mark.parametrize("num_layers", [0, NUM_LAYERS, NUM_LAYERS + 1, True, "2"])
def test_draft_depth_outside_the_model_is_refused(deep, num_layers):
    with pytest.raises(ValueError, match=f"between 1 and {NUM_LAYERS - 1} of the model's {NUM_LAYERS} layers"):
        truncated_draft(deep, num_layers)


def test_model_without_decoder_layers_is_refused(deep):
    with pytest.raises(ValueError, match="Model keeps no decoder layers at model.layers"):
        truncated_draft(Model(deep.config), 1)
