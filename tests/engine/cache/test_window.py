"""Sliding-window layers in window slots (engine/cache/window.py) through the whole engine: a tiny Gemma 3 (two
sliding layers, two full ones) and a tiny Mistral (every layer sliding), window 6 over pages of 4 tokens.

Every test holds a generator whose windowed layers give back their pages to the same model over a cache that
keeps every page (sliding_tokens=max_seq_len): float32 weights, so equal tokens mean the rows read were the
right ones, not a near-tie.

Bad inputs tried: a window pool too small for one window and step, a draft cache whose windowed layers are in
slots, sliding_tokens=0.
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
from engine.models import Model

PAGE, WINDOW, CHUNK = 4, 6, 8
MAX_SEQ_LEN = 512
POOL = 48  # sliding-window tokens across all jobs: about two jobs' windows and prompt chunks
TEXT = (
    "The river had frozen early that year, and the ferry stayed tied to the dock until spring. She kept a "
    "notebook of every bird she saw, with the date, the weather and a small sketch. Compilers turn source text "
    "into tokens, then into a tree, and only then into machine code. "
)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _build(folder, tiny_folder, family: str):
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_folder / name, folder / name)
    common = dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, sliding_window=WINDOW, max_position_embeddings=1024, bos_token_id=1,
        eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(11)
    if family == "gemma3":
        config = transformers.Gemma3TextConfig(
            **common, query_pre_attn_scalar=32, initializer_range=0.2,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        )  # fmt: skip
        transformers.Gemma3ForCausalLM(config).eval().save_pretrained(folder)
    else:
        transformers.MistralForCausalLM(transformers.MistralConfig(**common)).eval().save_pretrained(folder)
    return Model.load(folder, dtype=torch.float32)


@pytest.fixture(scope="module", params=["gemma3", "mistral"])
def model(request, tmp_path_factory, tiny_folder):
    return _build(tmp_path_factory.mktemp(request.param), tiny_folder, request.param)


def generator(model, windowed: bool, kv_format: str = "bf16", **kw) -> DynamicGenerator:
    pool = POOL if windowed else MAX_SEQ_LEN
    cache = Cache(model, MAX_SEQ_LEN, page_size=PAGE, kv_format=kv_format, sliding_tokens=pool, **kw)
    assert bool(cache.window_layers) == windowed
    return DynamicGenerator(model, cache, model.tokenizer, max_chunk_size=CHUNK)


def greedy(ids, identifier, n: int = 16, **kw) -> DynamicJob:
    settings = kw.pop("gen_settings", SamplerSettings.greedy())
    return DynamicJob(ids, n, min_new_tokens=n, stop_conditions=[], gen_settings=settings, identifier=identifier, **kw)


def run(gen: DynamicGenerator, jobs: list[DynamicJob]) -> dict[object, dict]:
    gen.enqueue(jobs)
    ends = {}
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["eos"]:
                ends[r["identifier"]] = r
    return ends


def prompts(model, count: int, words: int = 30) -> list[list[int]]:
    text = TEXT.split()
    return [model.tokenizer.encode_ids(" ".join(text[i : i + words + 3 * i])) for i in range(count)]


def tokens(results: dict) -> dict:
    return {k: r["full_completion"] for k, r in results.items()}


def test_the_windowed_layers_hold_only_the_pool(model):
    windowed = Cache(model, MAX_SEQ_LEN, page_size=PAGE, sliding_tokens=POOL)
    plain = Cache(model, MAX_SEQ_LEN, page_size=PAGE, sliding_tokens=MAX_SEQ_LEN)
    layers = model.config.num_hidden_layers
    sliding = len(windowed.window_layers)
    assert sliding == (2 if model.config.architecture.startswith("Gemma3") else layers)
    per_layer = plain.num_bytes // layers
    assert windowed.num_bytes == (layers - sliding) * per_layer + sliding * per_layer * POOL // MAX_SEQ_LEN
    for i in windowed.window_layers:
        assert windowed.k[i].shape[0] == POOL // PAGE


@pytest.mark.parametrize("kv_format", ["bf16", "q8"])
def test_jobs_give_the_tokens_of_a_cache_that_keeps_every_page(model, kv_format):
    """Five long jobs at once, more than the pool holds: some wait for slots, all finish with the same tokens."""
    jobs = lambda: [greedy(ids, i, n=24, return_logits=True) for i, ids in enumerate(prompts(model, 5))]  # noqa: E731
    windowed = generator(model, True, kv_format)
    got, want = run(windowed, jobs()), run(generator(model, False, kv_format), jobs())
    assert tokens(got) == tokens(want)
    for key, result in got.items():  # the same rows read, in the same order: the same logits
        torch.testing.assert_close(result["logits"], want[key]["logits"], atol=1e-5, rtol=0)
    manager = windowed.cache_manager
    assert manager.window.reserved == 0 and all(r == 0 for r in manager.window.refs)


def test_a_shared_prefix_resumes_from_the_slots_still_cached(model):
    first, second = prompts(model, 2, words=40)
    longer = first + second[:9]
    windowed, plain = generator(model, True), generator(model, False)
    for gen in (windowed, plain):
        run(gen, [greedy(first, "first")])
    again = run(windowed, [greedy(longer, "longer")])["longer"]
    assert again["cached_tokens"] >= len(first) - PAGE  # the window before the resume point was still cached
    assert again["full_completion"] == run(plain, [greedy(longer, "longer")])["longer"]["full_completion"]


def test_a_prefix_whose_window_was_reused_resumes_earlier_with_the_same_tokens(model):
    first, *others = prompts(model, 4, words=40)
    windowed, plain = generator(model, True), generator(model, False)
    run(windowed, [greedy(first, "first")])
    run(windowed, [greedy(ids, i, n=30) for i, ids in enumerate(others)])  # their slots reuse first's
    again = run(windowed, [greedy(first + [5, 6, 7], "again")])["again"]
    assert again["cached_tokens"] < len(first) - PAGE
    assert again["full_completion"] == run(plain, [greedy(first + [5, 6, 7], "again")])["again"]["full_completion"]


def test_cfg_ngram_drafts_and_banned_strings_over_window_slots(model):
    positive, negative, other = prompts(model, 3)
    cfg = SamplerSettings.greedy(cfg_scale=1.0)

    def jobs():
        return [
            greedy([positive, negative], "cfg", gen_settings=cfg),
            greedy(other * 2, "repeat", n=30),
            greedy(positive, "banned", n=30, banned_strings=["the", " a", "er"]),
        ]

    def make(windowed: bool) -> DynamicGenerator:
        cache = Cache(model, MAX_SEQ_LEN, page_size=PAGE, sliding_tokens=POOL if windowed else MAX_SEQ_LEN)
        return DynamicGenerator(model, cache, model.tokenizer, max_chunk_size=CHUNK, use_ngram_draft=True)

    assert tokens(run(make(True), jobs())) == tokens(run(make(False), jobs()))


def test_a_restart_reads_the_window_back_from_disk(model, tmp_path):
    ids = prompts(model, 1, words=60)[0]
    first = generator(model, True, disk_dir=tmp_path)
    cold = run(first, [greedy(ids, "cold")])["cold"]
    first.cache.disk.flush()
    later = generator(model, True, disk_dir=tmp_path)
    warm = run(later, [greedy(ids, "warm")])["warm"]
    assert warm["cached_tokens"] >= len(ids) - 2 * PAGE
    assert warm["full_completion"] == cold["full_completion"]


def test_a_pool_too_small_for_one_window_is_refused_with_the_size_to_use(model):
    cache = Cache(model, MAX_SEQ_LEN, page_size=PAGE, sliding_tokens=PAGE)
    gen = DynamicGenerator(model, cache, model.tokenizer, max_chunk_size=CHUNK)
    with pytest.raises(ValueError, match=r"sliding_tokens >= \d+"):
        gen.enqueue(greedy(prompts(model, 1)[0], "x"))
    with pytest.raises(ValueError, match="sliding_tokens must be positive"):
        Cache(model, MAX_SEQ_LEN, page_size=PAGE, sliding_tokens=0)


def test_a_draft_cache_must_keep_every_page(model):
    cache = Cache(model, MAX_SEQ_LEN, page_size=PAGE, sliding_tokens=MAX_SEQ_LEN)
    draft_cache = Cache(model, MAX_SEQ_LEN, page_size=PAGE, sliding_tokens=POOL)
    with pytest.raises(ValueError, match="sliding_tokens=max_seq_len"):
        DynamicGenerator(model, cache, model.tokenizer, draft_model=model, draft_cache=draft_cache)
