"""Classifier-free guidance on the tiny real model: scale 1 is the positive prompt alone, the first step's
distribution is the mixing formula applied to two separate runs' logits, greedy tokens match a hand-rolled
loop over transformers' forward, other jobs are untouched, pages are freed, speculation skips CFG jobs.

Bad inputs tried: three prompts (a [3, n] tensor and a list of three), an empty negative prompt (a list and
a tensor), a negative row that is only padding, cfg_scale None / NaN / "1.5", a negative prompt with ids
outside the vocabulary, a pair too large for the cache, a pair on an unpaged (one-sequence) generator.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cache import Cache
from engine.compat.exllamav2 import ExLlamaV2Config, ExLlamaV2Tokenizer
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings

PAGE_SIZE = 16
POS = [70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88]  # 19 tokens: two pages
NEG = [200, 201, 202, 203, 204, 205, 206, 207, 208]


@pytest.fixture(autouse=True)
def one_thread():
    # The tiny model's matrices are far too small to share between threads; on a busy machine OpenMP's
    # hand-offs dominate (a [55, 64] x [64, 96] product takes milliseconds with two threads).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_gen(model, pages=64, **kw):
    cache = Cache(model, max_seq_len=pages * PAGE_SIZE, page_size=PAGE_SIZE)
    return DynamicGenerator(model, cache, model.tokenizer, **kw)


def run(gen, jobs, arrivals=None) -> dict[object, list[dict]]:
    """Enqueue each job at its arrival step and iterate until all end; results per identifier."""
    results: dict[object, list[dict]] = {j.identifier: [] for j in jobs}
    pending = sorted(zip(arrivals or [0] * len(jobs), range(len(jobs))))
    step = 0
    while pending or gen.num_remaining_jobs():
        while pending and pending[0][0] <= step:
            gen.enqueue(jobs[pending.pop(0)[1]])
        for r in gen.iterate():
            results[r["identifier"]].append(r)
        step += 1
        assert step < 2000, "generator did not finish"
    return results


def ids_of(results: list[dict]) -> list[int]:
    return [t for r in results if "token_ids" in r for t in r["token_ids"][0].tolist()]


def greedy(scale: float | None = None) -> SamplerSettings:
    return SamplerSettings.greedy(cfg_scale=scale)


def cfg_job(pos, neg, n, ident, scale, **kw):
    settings = kw.pop("gen_settings", None) or greedy(scale)
    return DynamicJob((torch.tensor([pos]), torch.tensor([neg])), n, gen_settings=settings, identifier=ident, **kw)


def mixed(pos_logits: torch.Tensor, neg_logits: torch.Tensor, scale: float) -> torch.Tensor:
    """The guidance formula, written out here independently of engine.generator.guidance."""
    return scale * torch.log_softmax(pos_logits.double(), -1) + (1 - scale) * torch.log_softmax(neg_logits.double(), -1)


def test_scale_one_is_the_positive_prompt_alone(tiny_model):
    alone = run(make_gen(tiny_model), [DynamicJob(torch.tensor([POS]), 16, gen_settings=greedy(), identifier=0)])
    guided = run(make_gen(tiny_model), [cfg_job(POS, NEG, 16, 0, 1.0)])
    assert ids_of(guided[0]) == ids_of(alone[0])
    eos = guided[0][-1]
    assert eos["eos"] and eos["new_tokens"] == 16 and eos["prompt_tokens"] == len(POS)


def test_first_step_distribution_is_the_mixing_formula(tiny_model):
    # No truncation and no penalty: the sampled distribution is softmax of the mixed row itself.
    plain = SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, token_repetition_penalty=1.0)
    guided = SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, token_repetition_penalty=1.0, cfg_scale=1.5)
    opts = {"return_logits": True, "return_probs": True, "return_top_tokens": 5, "seed": 3}
    jobs = [
        DynamicJob(torch.tensor([POS]), 1, gen_settings=plain, identifier="pos", **opts),
        DynamicJob(torch.tensor([NEG]), 1, gen_settings=plain, identifier="neg", **opts),
        cfg_job(POS, NEG, 1, "cfg", None, gen_settings=guided, **opts),
    ]
    res = {k: [r for r in v if "logits" in r][0] for k, v in run(make_gen(tiny_model), jobs).items()}
    expected = mixed(res["pos"]["logits"][0, 0], res["neg"]["logits"][0, 0], 1.5)  # [V]
    got = res["cfg"]["logits"][0, 0].double()
    assert torch.allclose(got, expected, atol=1e-4)
    probs = torch.softmax(expected, -1)
    token = res["cfg"]["token_ids"][0, 0].item()
    assert res["cfg"]["token_probs"][0, 0].item() == pytest.approx(probs[token].item(), rel=1e-4)
    top = probs.topk(5)
    assert res["cfg"]["top_k_tokens"][0, 0].tolist() == top.indices.tolist()
    assert torch.allclose(res["cfg"]["top_k_probs"][0, 0].double(), top.values, atol=1e-5)
    # Guidance changed the distribution: the test would notice a generator that ignored the negative prompt.
    assert not torch.allclose(probs, torch.softmax(res["pos"]["logits"][0, 0].double(), -1), atol=1e-3)


def hand_rolled_cfg(hf, pos, neg, scale, n) -> list[int]:
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            lp = hf(torch.tensor([pos + out])).logits[0, -1]
            ln = hf(torch.tensor([neg + out])).logits[0, -1]
            out.append(int(mixed(lp, ln, scale).argmax()))
    return out


def test_greedy_cfg_matches_a_hand_rolled_loop(tiny_model, tiny_hf):
    neg = list(range(100, 140))  # longer than the positive prompt: several prefill chunks
    expected = hand_rolled_cfg(tiny_hf, POS, neg, 2.5, 16)
    alone = run(make_gen(tiny_model), [DynamicJob(torch.tensor([POS]), 16, gen_settings=greedy(), identifier=0)])
    assert expected != ids_of(alone[0])  # guidance changes the greedy output here
    for chunk in (2048, 8, 5):  # one chunk each, and prefill that ends at different iterates for the two halves
        got = run(make_gen(tiny_model, max_chunk_size=chunk), [cfg_job(POS, neg, 16, 0, 2.5)])
        assert ids_of(got[0]) == expected, chunk


def test_cfg_job_beside_other_jobs_leaves_them_unchanged(tiny_model):
    def others():
        sampled = SamplerSettings(temperature=1.0, top_k=40, top_p=0.9)
        return [
            DynamicJob(torch.tensor([POS[:7]]), 12, gen_settings=greedy(), identifier="a"),
            DynamicJob(torch.tensor([NEG + [9, 10]]), 10, gen_settings=sampled, seed=11, identifier="b"),
            DynamicJob(torch.tensor([list(range(30, 60))]), 14, gen_settings=greedy(), identifier="c"),
        ]

    def guided():  # greedy, and seeded sampling: both give the same tokens alone and in a batch
        sampled = SamplerSettings(temperature=1.2, top_k=50, top_p=0.95, cfg_scale=1.8)
        return [cfg_job(POS, NEG, 16, "g", 2.0), cfg_job(NEG, POS, 12, "s", None, gen_settings=sampled, seed=4)]

    solo = {j.identifier: ids_of(run(make_gen(tiny_model), [j])[j.identifier]) for j in others() + guided()}
    for arrivals in ([0, 0, 0, 0, 0], [0, 3, 5, 1, 2]):
        gen = make_gen(tiny_model, max_chunk_size=8)
        together = run(gen, others() + guided(), arrivals)
        assert {k: ids_of(together[k]) for k in solo} == solo
        assert gen.page_table.referenced_pages() == []


def test_cancel_frees_both_sequences_at_any_stage(tiny_model):
    gen = make_gen(tiny_model, max_chunk_size=8)
    jobs = [cfg_job([t + i for t in POS], list(range(100 + i, 140)), 30, i, 1.5) for i in range(3)]
    gen.enqueue(jobs)
    assert gen.cancel(jobs[2])  # waiting
    gen.iterate()
    assert gen.num_active_jobs() == 2  # two jobs, four sequences
    assert gen.cancel(jobs[0])  # prefilling
    for _ in range(8):
        gen.iterate()
    assert gen.cancel(jobs[1])  # decoding
    assert not gen.cancel(jobs[1])
    assert gen.num_remaining_jobs() == 0 and gen.scheduler.active == []
    assert gen.page_table.referenced_pages() == []


def test_both_prompts_use_and_fill_the_prefix_cache(tiny_model):
    neg = list(range(100, 140))
    gen = make_gen(tiny_model)
    first = run(gen, [cfg_job(POS, neg, 8, 0, 1.5)])
    # The negative prompt's full pages are named for later jobs, and a plain job with it as prompt reuses them.
    assert len(gen.page_table.match_full_pages(neg, len(neg) - 1)) == 2
    plain = run(gen, [DynamicJob(torch.tensor([neg]), 4, gen_settings=greedy(), identifier="p")])
    assert plain["p"][-1]["cached_tokens"] >= 32
    again = run(gen, [cfg_job(POS, neg, 8, 0, 1.5)])
    assert again[0][-1]["cached_tokens"] >= 16 and ids_of(again[0]) == ids_of(first[0])
    # A pair that shares its opening tokens is admitted at once and computes those pages in both halves.
    shared = run(make_gen(tiny_model), [cfg_job(POS + NEG, POS + [5, 6], 6, 0, 1.5)])
    assert shared[0][-1]["new_tokens"] == 6


def test_tight_cache_runs_pairs_one_after_another(tiny_model):
    # Each CFG job needs 2 + 2 pages of a 5-page cache: the second waits for the first, nothing deadlocks.
    gen = make_gen(tiny_model, pages=5)
    jobs = [cfg_job(POS, NEG, 10, i, 1.5) for i in range(2)]
    res = run(gen, jobs)
    assert ids_of(res[0]) == ids_of(res[1]) and len(ids_of(res[0])) == 10
    assert gen.page_table.referenced_pages() == []


STEMS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [5, 6, 7, 8, 20, 21], [30, 31, 32, 33, 34, 35, 36, 37]]
prompt = st.tuples(st.integers(0, 2), st.lists(st.integers(3, 60), max_size=6))
schedule = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), prompt, st.one_of(st.none(), prompt), st.integers(1, 10)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("iterate"), st.integers(1, 4)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule)
def test_random_schedules_with_cfg_jobs_keep_ref_counts_exact(tiny_model, operations):
    page = 4
    gen = DynamicGenerator(tiny_model, Cache(tiny_model, page * 24, page), tiny_model.tokenizer, max_chunk_size=5)
    jobs: list[DynamicJob] = []

    def check() -> None:
        holders = Counter(p.page_id for seq in gen.scheduler.active for p in seq.pages)
        assert all(p.ref_count == holders[p.page_id] for p in gen.page_table.pages)
        for seq in gen.scheduler.active:  # a CFG job's halves are active together
            assert seq.negative is None or seq.negative in gen.scheduler.active

    for op in operations:
        if op[0] == "enqueue":
            _, (stem, tail), negative, n = op
            ids = STEMS[stem] + tail
            if negative is not None:
                ids = (ids, STEMS[negative[0]] + negative[1])
            job = DynamicJob(ids, n, gen_settings=greedy(1.5))
            gen.enqueue(job)
            jobs.append(job)
        elif op[0] == "cancel" and jobs:
            gen.cancel(jobs[op[1] % len(jobs)])
        else:
            for _ in range(op[1]):
                gen.iterate()
        check()
    for _ in range(2000):
        if not gen.num_remaining_jobs():
            break
        gen.iterate()
        check()
    assert gen.num_remaining_jobs() == 0 and gen.scheduler.active == []
    assert gen.page_table.num_free == 24


def test_pair_that_needs_every_free_page_does_not_hold_a_copy_source(tiny_model):
    # A plain run leaves POS's first page named and its second page partly filled, both unreferenced. The pair
    # then needs all 5 free pages (1 new for the positive, 4 for the negative): the positive must not keep the
    # partial page as a copy source, which would leave its negative half one page short.
    neg = list(range(100, 145))
    expected = ids_of(run(make_gen(tiny_model), [cfg_job(POS, neg, 13, 0, 1.5)])[0])
    gen = make_gen(tiny_model, pages=6)
    run(gen, [DynamicJob(torch.tensor([POS]), 4, gen_settings=greedy(), identifier="warm")])
    assert ids_of(run(gen, [cfg_job(POS, neg, 13, 0, 1.5)])[0]) == expected
    assert gen.page_table.referenced_pages() == []


def test_banned_string_rewinds_both_sequences(tiny_model):
    base = run(make_gen(tiny_model), [cfg_job(POS, NEG, 16, 0, 2.0)])
    text = "".join(r.get("text", "") for r in base[0])
    banned = text[3:6]
    gen = make_gen(tiny_model)
    res = run(gen, [cfg_job(POS, NEG, 16, 0, 2.0, banned_strings=[banned])])
    out = "".join(r.get("text", "") for r in res[0])
    assert any("suppressed_text" in r for r in res[0]) and banned not in out
    assert res[0][-1]["new_tokens"] == 16 and gen.page_table.referenced_pages() == []


def test_speculation_settings_leave_cfg_jobs_plain(tiny_model):
    expected = ids_of(run(make_gen(tiny_model), [cfg_job(POS, NEG, 16, "g", 2.0)])["g"])
    repetitive = [5, 6, 7, 8] * 8
    draft_cache = Cache(tiny_model, max_seq_len=64 * PAGE_SIZE, page_size=PAGE_SIZE)
    for kw in ({"use_ngram_draft": True}, {"draft_model": tiny_model, "draft_cache": draft_cache}):
        jobs = [
            cfg_job(POS, NEG, 16, "g", 2.0),
            DynamicJob(torch.tensor([repetitive]), 16, gen_settings=greedy(), identifier="r"),
        ]
        res = run(make_gen(tiny_model, **kw), jobs)
        assert ids_of(res["g"]) == expected
        eos = res["g"][-1]
        assert eos["accepted_draft_tokens"] == 0 and eos["rejected_draft_tokens"] == 0
        other = res["r"][-1]
        assert other["accepted_draft_tokens"] + other["rejected_draft_tokens"] > 0  # the other job did speculate


def test_exllamav2_tokenizer_pair_is_a_cfg_input(tiny_model, tiny_folder):
    tok = ExLlamaV2Tokenizer(ExLlamaV2Config(str(tiny_folder)))
    positive, negative = "The quick brown fox jumps over the lazy dog.", "def add"
    ids = tok.encode([positive, negative])  # [2, n], the shorter row left-padded
    assert ids.shape[0] == 2 and ids[1, 0].item() == tok.pad_token_id
    separate = (tok.encode(positive), tok.encode(negative))
    a = cfg_job(*[s[0].tolist() for s in separate], 12, 0, 2.0)
    b = DynamicJob(ids, 12, gen_settings=greedy(2.0), identifier=0)
    assert b.left_padded and len(b.negative_ids) == ids.shape[1]
    out_a, out_b = ids_of(run(make_gen(tiny_model), [a])[0]), ids_of(run(make_gen(tiny_model), [b])[0])
    assert b.negative_ids == separate[1][0].tolist() and b.prompt_ids == separate[0][0].tolist()
    assert out_a == out_b


def test_left_padding_keeps_a_pad_valued_token_both_rows_start_with(tiny_model):
    pad = tiny_model.tokenizer.pad_token_id
    job = DynamicJob(torch.tensor([[pad, 5, 6, 7, 8], [pad, pad, pad, pad, 9]]), 4, gen_settings=greedy(1.5))
    make_gen(tiny_model).enqueue(job)
    assert job.prompt_ids == [pad, 5, 6, 7, 8] and job.negative_ids == [pad, 9]
    # A tuple of prompts is never padded: a leading pad id there is part of the prompt.
    job = DynamicJob(([5, 6], [pad, pad, 9]), 4, gen_settings=greedy(1.5))
    make_gen(tiny_model).enqueue(job)
    assert job.negative_ids == [pad, pad, 9]


def test_bad_inputs_name_the_problem(tiny_model):
    with pytest.raises(ValueError, match="batch size 3.*classifier-free guidance"):
        DynamicJob(torch.tensor([POS[:3]] * 3), 4, gen_settings=greedy(1.5))
    with pytest.raises(ValueError, match="holds 3 prompts"):
        DynamicJob([torch.tensor(POS)] * 3, 4, gen_settings=greedy(1.5))
    with pytest.raises(ValueError, match="negative prompt of the CFG pair is empty"):
        DynamicJob((POS, []), 4, gen_settings=greedy(1.5))
    with pytest.raises(ValueError, match="negative prompt of the CFG pair is empty"):
        DynamicJob((torch.tensor(POS), torch.tensor([], dtype=torch.long)), 4, gen_settings=greedy(1.5))
    with pytest.raises(ValueError, match="cfg_scale is None"):
        DynamicJob((POS, NEG), 4)
    with pytest.raises(ValueError, match="finite"):
        DynamicJob((POS, NEG), 4, gen_settings=greedy(math.nan))
    with pytest.raises(TypeError, match="cfg_scale must be a number"):  # SamplerSettings checks types itself
        greedy("1.5")
    with pytest.raises(ValueError, match="must be integer token ids"):
        DynamicJob((torch.tensor(POS, dtype=torch.float32), NEG), 4, gen_settings=greedy(1.5))
    gen = make_gen(tiny_model)
    pad = tiny_model.tokenizer.pad_token_id
    with pytest.raises(ValueError, match="negative row of the CFG input_ids is only padding"):
        gen.enqueue(DynamicJob(torch.tensor([[5, 6, 7], [pad, pad, pad]]), 4, gen_settings=greedy(1.5)))
    with pytest.raises(ValueError, match="negative prompt holds token ids outside the vocabulary"):
        gen.enqueue(DynamicJob((POS, [5, 10**6]), 4, gen_settings=greedy(1.5)))
    with pytest.raises(ValueError, match="needs 6 cache pages for its two sequences.*has 4"):
        make_gen(tiny_model, pages=4).enqueue(DynamicJob(([5] * 20, [6] * 20), 20, gen_settings=greedy(1.5)))
    unpaged = DynamicGenerator(
        tiny_model, Cache(tiny_model, max_seq_len=256, page_size=PAGE_SIZE), tiny_model.tokenizer, paged=False
    )
    with pytest.raises(ValueError, match="max_batch_size is 1"):
        unpaged.enqueue(DynamicJob((POS, NEG), 4, gen_settings=greedy(1.5)))
    assert gen.num_remaining_jobs() == 0 and gen.page_table.referenced_pages() == []
