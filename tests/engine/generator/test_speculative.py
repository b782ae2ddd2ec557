"""Speculative decoding (n-gram and draft model) on tiny real models: same greedy tokens as plain decoding,
the same sampled distribution, draft counters in eos results, and no unverified token in the prefix cache.

Bad inputs tried: a draft model without its cache (and the reverse), a draft cache with another page size,
a draft cache made for the main model, n-gram and draft model together, num_draft_tokens=0, max_ngram=0.
"""

from __future__ import annotations

import importlib.util
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.generator.speculative import ngram_draft
from engine.models import Model


def _load(name: str, path: Path):
    # conftest and sibling test modules are not importable as packages under --import-mode=importlib.
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_here = Path(__file__).resolve()
build_tiny = _load("spec_tests_conftest", _here.parents[2] / "conftest.py").build_tiny
_dyn = _load("spec_tests_dynamic", _here.parent / "test_dynamic.py")
Run, greedy_job, random_prompts = _dyn.Run, _dyn.greedy_job, _dyn.random_prompts

PAGES, PAGE_SIZE = 64, 16


def chi2_critical(dof: int, z: float = 3.09) -> float:
    """The chi-square quantile at p = 0.001 (z = 3.09), Wilson-Hilferty approximation (within 1% here)."""
    c = 2.0 / (9.0 * dof)
    return dof * (1.0 - c + z * c**0.5) ** 3


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory):
    """A second tiny model (other random weights) sharing the tiny tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-draft")
    build_tiny(folder, seed=1)
    return Model.load(folder, dtype=torch.float32)


def make_gen(model, draft=None, pages=PAGES, **kw):
    cache = Cache(model, max_seq_len=pages * PAGE_SIZE, page_size=PAGE_SIZE)
    if draft is not None:
        kw["draft_model"] = draft
        kw["draft_cache"] = Cache(draft, max_seq_len=pages * PAGE_SIZE, page_size=PAGE_SIZE)
    return DynamicGenerator(model, cache, model.tokenizer, **kw)


def mixed_jobs(model):
    """Repetitive and random prompts of different lengths; stops by token, string and max_new_tokens."""
    prompts = [[5, 6, 7, 8] * 9, [10, 11, 12] * 4 + [40]] + random_prompts(model, 4, 1, 40, seed=3)
    plain = Run(make_gen(model), [greedy_job(p, 24, i) for i, p in enumerate(prompts)])
    jobs = []
    for i, p in enumerate(prompts):
        kw = {}
        if i == 2:  # stop on a token the plain run produces mid-way
            kw["stop_conditions"] = [plain.ids(i)[9]]
        if i == 3:  # stop on a string that appears in the plain run's text
            kw["stop_conditions"] = [plain.text(i)[5:8]]
        if i == 4:
            kw["banned_strings"] = [plain.text(i)[4:7]]
        jobs.append((p, 24, i, kw))
    return jobs


def run_jobs(gen, jobs, arrivals=None):
    return Run(gen, [greedy_job(p, n, i, **kw) for p, n, i, kw in jobs], arrivals)


@pytest.mark.parametrize("drafter", ["ngram", "draft_model", "self"])
def test_greedy_same_tokens_as_plain_decoding(tiny_model, draft_model, drafter):
    jobs = mixed_jobs(tiny_model)
    arrivals = [0, 0, 1, 2, 2, 5]
    plain = run_jobs(make_gen(tiny_model, max_chunk_size=13), jobs, arrivals)
    if drafter == "ngram":
        gen = make_gen(tiny_model, max_chunk_size=13, use_ngram_draft=True, max_ngram=3)
    else:
        draft = tiny_model if drafter == "self" else draft_model
        gen = make_gen(tiny_model, draft, max_chunk_size=13, num_draft_tokens=5)
    spec = run_jobs(gen, jobs, arrivals)
    accepted = rejected = 0
    for _, _, i, _ in jobs:
        assert spec.ids(i) == plain.ids(i), f"job {i}: speculative tokens differ from plain decoding"
        assert spec.text(i) == plain.text(i)
        eos, ref = spec.eos(i), plain.eos(i)
        assert eos["eos_reason"] == ref["eos_reason"] and eos["full_completion"] == ref["full_completion"]
        assert "accepted_draft_tokens" not in ref
        assert 0 <= eos["accepted_draft_tokens"] < eos["new_tokens"]
        accepted += eos["accepted_draft_tokens"]
        rejected += eos["rejected_draft_tokens"]
    assert plain.eos(2)["eos_reason"] == "stop_token" and plain.eos(3)["eos_reason"] == "stop_string"
    assert any("suppressed_text" in r for r in spec.results[4])  # the banned string was undone there too
    if drafter == "self":
        assert rejected == 0 and accepted > 60, "the model as its own greedy draft must be accepted every time"
    else:
        assert accepted > 0 and rejected > 0
    assert gen.page_table.referenced_pages() == []


def test_verification_is_one_forward_bounded_by_max_q_size(tiny_model):
    gen = make_gen(tiny_model, tiny_model, num_draft_tokens=6, max_q_size=3)
    run = Run(gen, [greedy_job([4, 5, 6], 21, "a")])
    streaming = [r for r in run.results["a"] if r["stage"] == "streaming"]
    # First token from the prefill, then per verify forward 2 drafts + 1 bonus token: 20 = 6 * 3 + 2.
    assert len(streaming) == 1 + 7
    eos = run.eos("a")
    assert eos["new_tokens"] == 21 and eos["accepted_draft_tokens"] == 6 * 2 + 1
    assert eos["rejected_draft_tokens"] == 0


def test_prefix_cache_never_serves_unverified_tokens(tiny_model, draft_model):
    prompt = [5, 6, 7, 8] * 5 + [9]
    gen = make_gen(tiny_model, draft_model, num_draft_tokens=4)
    first = Run(gen, [greedy_job(prompt, 40, "a")])
    assert first.eos("a")["rejected_draft_tokens"] > 0
    out = first.ids("a")
    sequences = [prompt + out]
    for cut in (0, 3, 12, 27, 40):
        follow = prompt + out[:cut] + [3]
        again = Run(gen, [greedy_job(follow, 6, cut)])
        fresh = Run(make_gen(tiny_model), [greedy_job(follow, 6, cut)])
        assert again.ids(cut) == fresh.ids(cut), f"follow-up after {cut} tokens differs from a fresh generator"
        if cut >= 12:
            assert again.eos(cut)["cached_tokens"] >= PAGE_SIZE
        sequences.append(follow + again.ids(cut))
    # Every named page holds a page-aligned run of some job's verified sequence, never a drafted token.
    chunks = {tuple(seq[i : i + PAGE_SIZE]) for seq in sequences for i in range(0, len(seq), PAGE_SIZE)}
    named = [p for p in gen.page_table.pages if p.hash is not None]
    assert len(named) >= 4 and all(tuple(p.token_ids) in chunks for p in named)


def sampled_counts(model, draft, seeds, **gen_kw) -> tuple[Counter, int, int]:
    """Joint counts of generated tokens 2..4 over many seeded jobs (token 1 comes from the prefill)."""
    settings = SamplerSettings(temperature=1.0, top_k=3, top_p=1.0, token_repetition_penalty=1.0)
    gen = make_gen(model, draft, pages=256, max_batch_size=256, **gen_kw)
    prompt = [5, 6, 7, 8] * 3
    jobs = [DynamicJob(torch.tensor([prompt]), 4, gen_settings=settings, seed=s, identifier=s) for s in seeds]
    run = Run(gen, jobs)
    counts = Counter(tuple(run.ids(s)[1:]) for s in seeds)
    accepted = sum(run.eos(s).get("accepted_draft_tokens", 0) for s in seeds)
    rejected = sum(run.eos(s).get("rejected_draft_tokens", 0) for s in seeds)
    return counts, accepted, rejected


def chi2_same(a: Counter, b: Counter) -> tuple[float, int]:
    """Two-sample chi-square statistic of homogeneity and its degrees of freedom (rare cells pooled)."""
    na, nb = sum(a.values()), sum(b.values())
    cells = sorted(set(a) | set(b), key=lambda c: -(a[c] + b[c]))
    rows, other = [], [0, 0]
    for c in cells:
        if (a[c] + b[c]) * min(na, nb) / (na + nb) >= 8:
            rows.append((a[c], b[c]))
        else:
            other[0] += a[c]
            other[1] += b[c]
    if sum(other):
        rows.append(tuple(other))
    stat = 0.0
    for x, y in rows:
        total = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            stat += (observed - expected) ** 2 / expected
    return stat, len(rows) - 1


def test_sampled_distribution_unchanged(tiny_model, draft_model):
    """Accept/reject keeps the sampling distribution: chi-square against plain sampling, independent seeds."""
    n = 1000
    plain, _, _ = sampled_counts(tiny_model, None, range(n))
    # The model as its own (greedy) draft is often right and often wrong; the seed=1 draft is mostly wrong.
    for draft, min_accepted in ((tiny_model, 200), (draft_model, 0)):
        spec, accepted, rejected = sampled_counts(tiny_model, draft, range(n, 2 * n), num_draft_tokens=3)
        assert accepted >= min_accepted and rejected > 200, "the test needs accepted and rejected drafts"
        stat, dof = chi2_same(plain, spec)
        assert dof >= 3, f"{dof + 1} cells: pick settings with several likely sequences"
        assert stat < chi2_critical(dof), f"speculative sampling changed the distribution: chi2 {stat:.1f}, df {dof}"
    # The same test tells a different distribution apart (so it can fail): plain sampling at another temperature.
    hot, _, _ = sampled_counts_temp(tiny_model, range(2 * n, 3 * n), temperature=0.6)
    stat, dof = chi2_same(plain, hot)
    assert stat > chi2_critical(dof)


def sampled_counts_temp(model, seeds, temperature: float) -> tuple[Counter, int, int]:
    settings = SamplerSettings(temperature=temperature, top_k=3, top_p=1.0, token_repetition_penalty=1.0)
    gen = make_gen(model, None, pages=256, max_batch_size=256)
    prompt = [5, 6, 7, 8] * 3
    jobs = [DynamicJob(torch.tensor([prompt]), 4, gen_settings=settings, seed=s, identifier=s) for s in seeds]
    run = Run(gen, jobs)
    return Counter(tuple(run.ids(s)[1:]) for s in seeds), 0, 0


def test_seeded_speculative_sampling_is_reproducible(tiny_model):
    settings = SamplerSettings(temperature=1.2, top_k=20, token_repetition_penalty=1.1)

    def once():
        gen = make_gen(tiny_model, use_ngram_draft=True)
        jobs = [DynamicJob([5, 6, 7, 8] * 4, 20, gen_settings=settings, seed=i, identifier=i) for i in range(4)]
        run = Run(gen, jobs)
        return [run.ids(i) for i in range(4)]

    assert once() == once()


def test_ngram_draft_lookup():
    assert ngram_draft([1, 2, 3, 4, 1, 2], 3, 4, 100) == [3, 4, 1, 2]
    assert ngram_draft([1, 2, 3, 9, 2, 3, 7, 2, 3], 2, 2, 100) == [7, 2]  # most recent earlier match
    assert ngram_draft([1, 2, 3], 4, 4, 100) == []
    assert ngram_draft([1, 500, 501, 1], 2, 3, 100) == []  # image ids (outside the vocabulary) end a draft
    assert ngram_draft([7], 4, 4, 100) == []


def test_filters_and_images_fall_back_to_plain_decoding(tiny_model):
    from engine.generator.filters import ChoiceFilter

    gen = make_gen(tiny_model, use_ngram_draft=True)
    job = DynamicJob(
        [5, 6, 7, 8] * 3,
        10,
        gen_settings=SamplerSettings.greedy(),
        identifier="f",
        filters=[ChoiceFilter(["yes", "no"])],
    )
    run = Run(gen, [job])
    assert run.eos("f")["full_completion"] in ("yes", "no")
    assert run.eos("f")["accepted_draft_tokens"] == run.eos("f")["rejected_draft_tokens"] == 0


def test_bad_speculation_arguments(tiny_model, draft_model):
    cache = Cache(tiny_model, max_seq_len=PAGES * PAGE_SIZE, page_size=PAGE_SIZE)
    tok = tiny_model.tokenizer
    draft_cache = Cache(draft_model, max_seq_len=PAGES * PAGE_SIZE, page_size=PAGE_SIZE)
    with pytest.raises(ValueError, match="draft_model and draft_cache go together"):
        DynamicGenerator(tiny_model, cache, tok, draft_model=draft_model)
    with pytest.raises(ValueError, match="draft_model and draft_cache go together"):
        DynamicGenerator(tiny_model, cache, tok, draft_cache=draft_cache)
    with pytest.raises(ValueError, match="draft_cache was made for a different model"):
        DynamicGenerator(tiny_model, cache, tok, draft_model=draft_model, draft_cache=cache)
    other = Cache(draft_model, max_seq_len=PAGES * PAGE_SIZE, page_size=32)
    with pytest.raises(ValueError, match="page_size 16"):
        DynamicGenerator(tiny_model, cache, tok, draft_model=draft_model, draft_cache=other)
    with pytest.raises(ValueError, match="choose one"):
        DynamicGenerator(tiny_model, cache, tok, draft_model=draft_model, draft_cache=draft_cache, use_ngram_draft=True)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        DynamicGenerator(tiny_model, cache, tok, use_ngram_draft=True, num_draft_tokens=0)
    with pytest.raises(ValueError, match="max_ngram"):
        DynamicGenerator(tiny_model, cache, tok, use_ngram_draft=True, max_ngram=0)


def test_random_mix_of_greedy_jobs_matches_plain(tiny_model, draft_model):
    rng = random.Random(7)
    prompts = random_prompts(tiny_model, 8, 1, 30, seed=7)
    prompts = [p + p[: rng.randint(0, len(p))] for p in prompts]  # some self-repetition for the n-gram drafter
    jobs = [(p, rng.randint(2, 20), i, {}) for i, p in enumerate(prompts)]
    arrivals = [rng.randint(0, 6) for _ in jobs]
    plain = run_jobs(make_gen(tiny_model, pages=24, max_chunk_size=9), jobs, arrivals)
    for kw in ({"use_ngram_draft": True}, {"draft": draft_model}):
        draft = kw.pop("draft", None)
        spec = run_jobs(make_gen(tiny_model, draft, pages=24, max_chunk_size=9, **kw), jobs, arrivals)
        for _, _, i, _ in jobs:
            assert spec.ids(i) == plain.ids(i), f"job {i} differs with {kw or 'draft model'}"
