"""The dynamic generator on a tiny real model: batching parity, prefix cache, stops, bans, errors."""

from __future__ import annotations

import random

import pytest
import torch

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings


def make_gen(model, pages=64, page_size=16, **kw):
    cache = Cache(model, max_seq_len=pages * page_size, page_size=page_size)
    return DynamicGenerator(model, cache, model.tokenizer, **kw)


class Run:
    """Drive a generator: enqueue jobs at their arrival step, collect every result per identifier."""

    def __init__(self, gen, jobs, arrivals=None):
        self.results: dict[object, list[dict]] = {j.identifier: [] for j in jobs}
        arrivals = arrivals or [0] * len(jobs)
        pending, step = sorted(zip(arrivals, range(len(jobs))), key=lambda p: p[0]), 0
        while pending or gen.num_remaining_jobs():
            while pending and pending[0][0] <= step:
                gen.enqueue(jobs[pending.pop(0)[1]])
            for r in gen.iterate():
                self.results[r["identifier"]].append(r)
            step += 1
            assert step < 5000, "generator did not finish"

    def ids(self, ident) -> list[int]:
        return [t for r in self.results[ident] if "token_ids" in r for t in r["token_ids"][0].tolist()]

    def text(self, ident) -> str:
        return "".join(r.get("text", "") for r in self.results[ident])

    def eos(self, ident) -> dict:
        last = self.results[ident][-1]
        assert last["eos"]
        return last


def greedy_job(ids, n, ident, **kw):
    return DynamicJob(torch.tensor([ids]), n, gen_settings=SamplerSettings.greedy(), identifier=ident, **kw)


def hf_greedy(hf, ids, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def random_prompts(model, n, lo, hi, seed):
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def test_greedy_batch_equals_alone_and_transformers(tiny_model, tiny_hf):
    rng = random.Random(1)
    prompts = random_prompts(tiny_model, 12, 1, 60, seed=1)
    lengths = [rng.randint(4, 24) for _ in prompts]
    arrivals = [rng.randint(0, 10) for _ in prompts]
    jobs = [greedy_job(p, n, i) for i, (p, n) in enumerate(zip(prompts, lengths))]
    together = Run(make_gen(tiny_model, max_chunk_size=17), jobs, arrivals)
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        alone = Run(make_gen(tiny_model), [greedy_job(p, n, i)])
        assert together.eos(i)["eos_reason"] == "max_new_tokens"
        assert together.ids(i) == alone.ids(i), f"job {i}: batched differs from alone"
        assert together.ids(i) == hf_greedy(tiny_hf, p, n), f"job {i}: differs from transformers"
        assert together.text(i) == tiny_model.tokenizer.decode(together.ids(i))


def test_seeded_sampling_same_alone_and_batched(tiny_model):
    settings = SamplerSettings(temperature=1.3, top_k=40, top_p=0.95, token_repetition_penalty=1.1)
    prompts = random_prompts(tiny_model, 6, 3, 30, seed=2)

    def job(i):
        return DynamicJob(torch.tensor([prompts[i]]), 20, gen_settings=settings, seed=100 + i, identifier=i)

    together = Run(make_gen(tiny_model), [job(i) for i in range(6)], arrivals=[0, 0, 1, 3, 3, 7])
    for i in range(6):
        assert together.ids(i) == Run(make_gen(tiny_model), [job(i)]).ids(i)
    assert together.ids(0) != Run(
        make_gen(tiny_model), [DynamicJob(torch.tensor([prompts[0]]), 20, gen_settings=settings, seed=7, identifier=0)]
    ).ids(0)


def test_prefix_cache_reuses_pages_and_matches_cold(tiny_model):
    shared = random_prompts(tiny_model, 1, 70, 70, seed=3)[0]
    a, b = shared + [5, 6, 7], shared + [9, 10]
    gen = make_gen(tiny_model)
    first = Run(gen, [greedy_job(a, 10, "a")])
    assert first.eos("a")["cached_tokens"] == 0
    second = Run(gen, [greedy_job(b, 10, "b")])
    eos = second.eos("b")
    assert eos["cached_tokens"] >= (70 // 16) * 16
    assert eos["cached_pages"] >= 70 // 16
    assert second.ids("b") == Run(make_gen(tiny_model), [greedy_job(b, 10, "b")]).ids("b")
    # A follow-up turn: the first job's prompt + its answer + more shares everything before it.
    turn2 = a + first.ids("a") + [11, 12]
    third = Run(gen, [greedy_job(turn2, 5, "c")])
    assert third.eos("c")["cached_tokens"] >= len(a) + 10 - 1 - 15
    assert third.ids("c") == Run(make_gen(tiny_model), [greedy_job(turn2, 5, "c")]).ids("c")


def test_same_prefix_in_one_iterate_is_computed_once(tiny_model):
    shared = random_prompts(tiny_model, 1, 64, 64, seed=4)[0]
    gen = make_gen(tiny_model)
    run = Run(gen, [greedy_job(shared + [3], 4, "x"), greedy_job(shared + [4], 4, "y")])
    assert run.eos("x")["cached_tokens"] == 0
    assert run.eos("y")["cached_tokens"] == 64


def test_last_prompt_token_is_recomputed_even_on_a_full_hit(tiny_model):
    prompt = random_prompts(tiny_model, 1, 32, 32, seed=5)[0]  # exactly two pages of 16
    gen = make_gen(tiny_model)
    cold = Run(gen, [greedy_job(prompt, 6, 0)])
    warm = Run(gen, [greedy_job(prompt, 6, 0)])
    assert warm.eos(0)["cached_tokens"] == 31
    assert warm.ids(0) == cold.ids(0)


def _greedy_text_and_ids(model, prompt, n):
    run = Run(make_gen(model), [greedy_job(prompt, n, 0)])
    return run.text(0), run.ids(0)


def test_stop_string_split_across_tokens(tiny_model):
    tok = tiny_model.tokenizer
    prompt = random_prompts(tiny_model, 1, 10, 10, seed=6)[0]
    text, ids = _greedy_text_and_ids(tiny_model, prompt, 40)
    # A stop string made of the end of one token's text and the start of the next one's.
    pieces = [tok.decode(ids[: i + 1]) for i in range(len(ids))]
    for i in range(5, len(ids) - 1):
        stop = pieces[i][-2:] + pieces[i + 1][len(pieces[i]) : len(pieces[i]) + 2]
        if len(stop) >= 3 and text.find(stop) == len(pieces[i]) - 2:
            break
    else:
        pytest.skip("no token boundary with a usable stop string in this output")
    run = Run(make_gen(tiny_model), [greedy_job(prompt, 40, 0, stop_conditions=[stop])])
    eos = run.eos(0)
    assert eos["eos_reason"] == "stop_string" and eos["eos_triggering_string"] == stop
    assert run.text(0) == text[: text.find(stop)] == eos["full_completion"]


def test_stop_token_and_max_new_tokens_and_min_new_tokens(tiny_model):
    prompt = random_prompts(tiny_model, 1, 12, 12, seed=7)[0]
    _, ids = _greedy_text_and_ids(tiny_model, prompt, 30)
    stop = ids[3]
    first = ids.index(stop)
    run = Run(make_gen(tiny_model), [greedy_job(prompt, 30, 0, stop_conditions=[stop])])
    eos = run.eos(0)
    assert eos["eos_reason"] == "stop_token" and eos["eos_triggering_token_id"] == stop
    assert eos["new_tokens"] == first + 1
    assert Run(make_gen(tiny_model), [greedy_job(prompt, 7, 0)]).eos(0)["eos_reason"] == "max_new_tokens"
    held_off = Run(make_gen(tiny_model), [greedy_job(prompt, 30, 0, stop_conditions=[ids[0]], min_new_tokens=5)])
    assert held_off.eos(0)["new_tokens"] >= 5
    assert ids[0] not in held_off.ids(0)[:4]


def test_banned_string_rewinds_and_is_reported(tiny_model):
    prompt = random_prompts(tiny_model, 1, 12, 12, seed=8)[0]
    text, _ = _greedy_text_and_ids(tiny_model, prompt, 40)
    banned = text[len(text) // 2 : len(text) // 2 + 3]
    assert len(banned) == 3
    run = Run(make_gen(tiny_model), [greedy_job(prompt, 40, 0, banned_strings=[banned])])
    assert banned.lower() not in run.text(0).lower()
    assert any(r.get("suppressed_text", "").lower() == banned.lower() for r in run.results[0])
    assert run.text(0).startswith(text[: text.lower().find(banned.lower()) - 8])
    assert run.text(0) == run.eos(0)["full_completion"] == tiny_model.tokenizer.decode(run.ids(0))


def test_result_stages_and_keys(tiny_model):
    prompt = random_prompts(tiny_model, 1, 50, 50, seed=9)[0]
    job = greedy_job(prompt, 5, "k", return_probs=True, return_top_tokens=3, return_logits=True)
    run = Run(make_gen(tiny_model, max_chunk_size=16), [job])
    stages = [r["stage"] for r in run.results["k"]]
    assert stages[0] == "started" and stages.count("prefill") == 3 and stages[-1] == "streaming"
    prefill = [r for r in run.results["k"] if r["stage"] == "prefill"]
    assert [r["curr_progress"] for r in prefill] == [16, 32, 48] and prefill[0]["max_progress"] == 50
    streaming = [r for r in run.results["k"] if r["stage"] == "streaming"]
    for r in streaming:
        n = r["token_ids"].shape[1]
        assert r["token_probs"].shape == (1, n) and r["top_k_tokens"].shape == (1, n, 3)
        assert r["logits"].shape == (1, n, tiny_model.config.vocab_size)
        assert r["serial"] == job.serial and r["job"] is job
    eos = run.eos("k")
    for key in (
        "full_completion",
        "new_tokens",
        "prompt_tokens",
        "cached_tokens",
        "cached_pages",
        "time_enqueued",
        "time_prefill",
        "time_generate",
        "held",
    ):
        assert key in eos
    assert eos["prompt_tokens"] == 50 and eos["new_tokens"] == 5


def test_oversize_job_is_refused_with_page_counts(tiny_model):
    gen = make_gen(tiny_model, pages=4, page_size=16)
    with pytest.raises(ValueError, match=r"needs 5 cache pages.*has 4"):
        gen.enqueue(DynamicJob(torch.tensor([[5] * 40]), 30))


def test_job_that_does_not_fit_now_waits(tiny_model):
    gen = make_gen(tiny_model, pages=4, page_size=16)
    jobs = [greedy_job([5 + i] * 20, 20, i) for i in range(3)]  # each needs 3 of the 4 pages
    run = Run(gen, jobs)
    assert all(run.eos(i)["new_tokens"] == 20 for i in range(3))
    assert gen.page_table.referenced_pages() == []


def test_cancel_frees_pages_at_any_stage(tiny_model):
    gen = make_gen(tiny_model, max_chunk_size=8)
    jobs = [greedy_job([7] * 40, 30, i) for i in range(3)]
    gen.enqueue(jobs)
    gen.cancel(jobs[2])  # still waiting
    gen.iterate()
    gen.cancel(jobs[0])  # prefilling
    for _ in range(8):
        gen.iterate()
    gen.cancel(jobs[1])  # decoding
    assert gen.num_remaining_jobs() == 0
    assert gen.page_table.referenced_pages() == []


def test_bad_arguments(tiny_model):
    with pytest.raises(TypeError):
        DynamicJob(torch.tensor([[1, 2]]), 5, max_new_token=3)
    with pytest.raises(TypeError):
        make_gen(tiny_model, max_batchsize=4)
    with pytest.raises(ValueError, match="stop_conditions"):
        DynamicJob(torch.tensor([[1, 2]]), 5, stop_conditions=[1.5])
    with pytest.raises(ValueError, match="empty"):
        DynamicJob(torch.tensor([[]], dtype=torch.long), 5)
    with pytest.raises(ValueError, match="draft_model and draft_cache go together"):
        make_gen(tiny_model, draft_model=tiny_model)
    with pytest.raises(ValueError, match="vocabulary"):
        make_gen(tiny_model).enqueue(DynamicJob(torch.tensor([[1, 10**6]]), 5))


def test_generate_waits_only_for_its_own_jobs(tiny_model):
    gen = make_gen(tiny_model)
    other = greedy_job([9] * 10, 30, "other")
    gen.enqueue(other)
    gen.iterate()
    text = gen.generate(
        "The quick brown", max_new_tokens=8, gen_settings=SamplerSettings.greedy(), completion_only=True
    )
    assert isinstance(text, str) and text
    assert gen.num_remaining_jobs() == 1
    rest = []
    while gen.num_remaining_jobs():
        rest += gen.iterate()
    # The other job's results produced during generate() were kept, none lost.
    ids = [t for r in rest if "token_ids" in r for t in r["token_ids"][0].tolist()]
    assert rest[-1]["eos"] and rest[-1]["new_tokens"] == 30 and len(ids) <= 30
    many = gen.generate(["One two", "def add"], max_new_tokens=4, gen_settings=SamplerSettings.greedy())
    assert len(many) == 2 and many[0].startswith("One two")
