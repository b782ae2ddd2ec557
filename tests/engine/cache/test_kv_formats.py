"""The quantized KV caches (kv_format q8, q6, q4) through the whole engine on the tiny Llama with heads of 32:
their bytes, their quality against the bfloat16 cache, and the generator's features on them (prefix reuse,
n-gram and draft-model speculation, CFG, jobs batched together, images in a tiny LLaVA).

Bad inputs tried: a format name that does not exist ("q5", "Q8", ""), a quantized format on a model whose
heads (16) are not a multiple of 32.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

from engine.bench import kv_formats
from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Model
from kernels.torch_ref import kv_quant

QUANTIZED = ("q8", "q6", "q4")
PAGE_SIZE = 16
TEXT = (
    "The river had frozen early that year, and the ferry stayed tied to the dock until spring. She kept a "
    "notebook of every bird she saw, with the date, the weather and a small sketch. Compilers turn source text "
    "into tokens, then into a tree, and only then into machine code. "
)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's products are too small to share between threads
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("kv_format", QUANTIZED)
def test_bytes_count_every_block_and_scale(tiny_wide_model, kv_format):
    config = tiny_wide_model.config
    cache = Cache(tiny_wide_model, 64, page_size=PAGE_SIZE, kv_format=kv_format)
    bits = kv_quant.FORMATS[kv_format]
    row = config.head_dim // 32 * (2 + 32 * bits // 8)
    assert cache.k[0].dtype == torch.uint8 and cache.k[0].shape == (4, PAGE_SIZE, config.num_key_value_heads, row)
    assert cache.num_bytes == 2 * config.num_hidden_layers * 64 * config.num_key_value_heads * row
    plain = Cache(tiny_wide_model, 64, page_size=PAGE_SIZE, dtype=torch.bfloat16)
    assert cache.bytes_per_token / plain.bytes_per_token <= kv_formats.BUDGETS[kv_format][0]


@pytest.mark.parametrize("name", ["q5", "Q8", ""])
def test_an_unknown_format_is_refused_with_the_names(tiny_wide_model, name):
    with pytest.raises(ValueError, match="bf16, q8, q6, q4"):
        Cache(tiny_wide_model, 64, page_size=PAGE_SIZE, kv_format=name)


def test_heads_of_16_cannot_be_quantized(tiny_model):
    with pytest.raises(ValueError, match="multiple of 32.*kv_format='bf16'"):
        Cache(tiny_model, 64, page_size=PAGE_SIZE, kv_format="q4")


def test_mean_kl_stays_within_each_formats_budget(tiny_wide_model):
    ids = tiny_wide_model.tokenizer.encode_ids(TEXT * 4)[:400]  # the docs' text in the bench
    kl = kv_formats.mean_kl(tiny_wide_model, ids, page_size=PAGE_SIZE)
    for name in QUANTIZED:
        assert 0 < kl[name] <= kv_formats.BUDGETS[name][1], kl
    assert kl["q8"] < kl["q6"] < kl["q4"], kl  # fewer bits, further from the bfloat16 cache


def generator(model, kv_format: str, pages: int = 64, **kw) -> DynamicGenerator:
    cache = Cache(model, pages * PAGE_SIZE, page_size=PAGE_SIZE, kv_format=kv_format)
    if "draft_model" in kw:
        kw["draft_cache"] = Cache(kw["draft_model"], pages * PAGE_SIZE, page_size=PAGE_SIZE, kv_format=kv_format)
    return DynamicGenerator(model, cache, model.tokenizer, **kw)


def run(gen: DynamicGenerator, jobs: list[DynamicJob]) -> dict[object, dict]:
    """Each job's eos result, by identifier."""
    gen.enqueue(jobs)
    ends = {}
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["eos"]:
                ends[r["identifier"]] = r
    return ends


def greedy(ids, identifier, n: int = 12, **kw) -> DynamicJob:
    settings = kw.pop("gen_settings", SamplerSettings.greedy())
    return DynamicJob(ids, n, min_new_tokens=n, stop_conditions=[], gen_settings=settings, identifier=identifier, **kw)


def prompts(model, count: int) -> list[list[int]]:
    words = TEXT.split()
    return [model.tokenizer.encode_ids(" ".join(words[i : i + 5 + 7 * i])) for i in range(count)]


@pytest.mark.parametrize("kv_format", QUANTIZED)
def test_a_cached_prefix_gives_the_cold_answer(tiny_wide_model, kv_format):
    ids = tiny_wide_model.tokenizer.encode_ids(TEXT)
    gen = generator(tiny_wide_model, kv_format)
    cold = run(gen, [greedy(ids, "cold")])["cold"]
    warm = run(gen, [greedy(ids, "warm")])["warm"]
    assert cold["cached_tokens"] == 0 and warm["cached_tokens"] >= PAGE_SIZE
    assert warm["full_completion"] == cold["full_completion"]


@pytest.mark.parametrize("kv_format", ["q8", "q4"])
def test_jobs_batched_together_give_their_solo_tokens(tiny_wide_model, kv_format):
    batch = prompts(tiny_wide_model, 6)
    solo = [run(generator(tiny_wide_model, kv_format), [greedy(ids, i)])[i] for i, ids in enumerate(batch)]
    together = run(generator(tiny_wide_model, kv_format), [greedy(ids, i) for i, ids in enumerate(batch)])
    assert [together[i]["full_completion"] for i in range(len(batch))] == [s["full_completion"] for s in solo]


@pytest.mark.parametrize("drafter", ["ngram", "self"])
def test_speculation_keeps_the_greedy_tokens(tiny_wide_model, drafter):
    ids = tiny_wide_model.tokenizer.encode_ids(TEXT * 2)
    plain = run(generator(tiny_wide_model, "q4"), [greedy(ids, "p", 16)])["p"]
    options = {"use_ngram_draft": True} if drafter == "ngram" else {"draft_model": tiny_wide_model}
    drafted = run(generator(tiny_wide_model, "q4", num_draft_tokens=4, **options), [greedy(ids, "d", 16)])["d"]
    assert drafted["full_completion"] == plain["full_completion"]
    assert "accepted_draft_tokens" in drafted


def test_guidance_at_scale_one_is_the_positive_prompt_alone(tiny_wide_model):
    positive, negative = prompts(tiny_wide_model, 3)[1:]
    alone = run(generator(tiny_wide_model, "q6"), [greedy(positive, "alone")])["alone"]
    settings = SamplerSettings.greedy(cfg_scale=1.0)
    pair = run(
        generator(tiny_wide_model, "q6"),
        [greedy([positive, negative], "cfg", gen_settings=settings)],
    )["cfg"]
    assert pair["full_completion"] == alone["full_completion"]


def _conftest():
    # conftest is not importable as a package under --import-mode=importlib
    spec = importlib.util.spec_from_file_location("kv_formats_conftest", Path(__file__).parents[2] / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def wide_llava(tmp_path_factory):
    """The tiny LLaVA with a text model of heads of 32 (hidden 128)."""
    folder = tmp_path_factory.mktemp("tiny-llava-wide")
    _conftest().build_tiny_llava(folder, hidden_size=128)
    return Model.load(folder, dtype=torch.float32)


def test_an_image_prompt_is_answered_and_its_pages_reused(wide_llava):
    def ask(gen, colour: str, identifier: str) -> dict:
        image = Image.new("RGB", (40, 32), "white")
        ImageDraw.Draw(image).ellipse((4, 4, 24, 24), fill=colour)
        emb = wide_llava.vision.get_image_embeddings(model=wide_llava, tokenizer=wide_llava.tokenizer, image=image)
        ids = wide_llava.tokenizer.encode(f"look at {emb.text_alias} and now tell me", embeddings=[emb])
        return run(gen, [greedy(ids, identifier, embeddings=[emb])])[identifier]

    gen = generator(wide_llava, "q4")
    red = ask(gen, "red", "red")
    again = ask(gen, "red", "again")
    assert again["cached_tokens"] >= PAGE_SIZE and again["full_completion"] == red["full_completion"]
    blue = ask(gen, "blue", "blue")
    assert blue["cached_tokens"] < again["cached_tokens"]  # another picture: its rows are not the red one's


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """A tiny Gemma 3 (sliding and full layers, window 5) with heads of 32."""
    import transformers

    config = transformers.Gemma3TextConfig(
        vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=512, initializer_range=0.05,
    )  # fmt: skip
    torch.manual_seed(7)
    folder = tmp_path_factory.mktemp("gemma3-wide")
    transformers.Gemma3ForCausalLM(config).eval().save_pretrained(folder)
    return Model.load(folder, dtype=torch.float32)


@pytest.mark.parametrize("kv_format", QUANTIZED)
def test_gemma3s_sliding_and_full_layers_read_quantized_pages(gemma3, kv_format):
    """Logits close to the float cache's (mean KL q8 1e-5, q6 2e-4, q4 4e-3), and the same whether the prompt
    came in one pass or in chunks that end inside pages and windows, one of them a single token."""
    from engine.models import Batch

    prompt = torch.randint(3, 211, (23,), generator=torch.Generator().manual_seed(3))

    def logits(kv_format: str, sizes: tuple[int, ...]) -> torch.Tensor:
        cache = Cache(gemma3, 64, page_size=4, kv_format=kv_format)
        table, past, out = [[5, 0, 7, 2, 9, 1]], 0, []
        for size in sizes:
            batch = Batch.build(cache, table, [past], [size], logits="all")
            out.append(gemma3(prompt[past : past + size], batch.positions(), batch))
            past += size
        return torch.cat(out)

    plain = torch.log_softmax(logits("bf16", (23,)), dim=-1)
    whole = logits(kv_format, (23,))
    kl = (plain.exp() * (plain - torch.log_softmax(whole, dim=-1))).sum(-1).mean()
    assert kl <= kv_formats.BUDGETS[kv_format][1], kl
    # torch's float32 matmuls round by row count, as they do over a float cache (about 1e-6 here): no more
    torch.testing.assert_close(logits(kv_format, (7, 1, 8, 4, 3)), whole, atol=1e-5, rtol=1e-5)
