"""Prefix reuse and rewinds for a hybrid model (Qwen3.5: linear-attention layers with a recurrent state), from the
state snapshots the cache keeps at page boundaries and at a finished turn's end (engine/cache/recurrent.py), on a
tiny random model: a second chat turn, fallbacks after eviction, speculative decoding (n-gram, a draft model, and
drafts that are kept or rejected at every offset from a page boundary), a banned-string rewind, a ragged batch, a
CFG pair.

Each reuse is held to a cold run on a fresh generator: the same greedy tokens and logits within 1e-4. A restore
that was skipped (the live slot left with another state) changes the logits far beyond that.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.generator.speculative import NgramDrafter
from engine.models import Model


def _load(name: str, path: Path):
    # conftest and sibling test modules are not importable as packages under --import-mode=importlib.
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_here = Path(__file__).resolve()
_conftest = _load("hybrid_tests_conftest", _here.parents[2] / "conftest.py")
_dyn = _load("hybrid_tests_dynamic", _here.parent / "test_dynamic.py")
_qwen = _load("hybrid_tests_qwen3_5", _here.parents[1] / "models" / "test_qwen3_5.py")
Run, greedy_job = _dyn.Run, _dyn.greedy_job

PAGE = 16


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The tiny Qwen3.5 of test_qwen3_5.py: two linear-attention layers of five, then one full, one of each."""
    folder = _qwen.build_tiny_qwen3_5(tmp_path_factory.mktemp("tiny-qwen3_5-prefix"))
    return Model.load(folder, dtype=torch.float32)


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory):
    """A tiny Llama (attention layers only) sharing the tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-llama-draft")
    _conftest.build_tiny(folder, seed=1)
    return Model.load(folder, dtype=torch.float32)


def make_gen(model, pages=64, draft=None, **kw):
    cache_kw = {k: kw.pop(k) for k in ("state_bytes", "snapshot_bytes") if k in kw}
    cache = Cache(model, max_seq_len=pages * PAGE, page_size=PAGE, **cache_kw)
    if draft is not None:
        kw["draft_model"] = draft
        kw["draft_cache"] = Cache(draft, max_seq_len=pages * PAGE, page_size=PAGE)
    return DynamicGenerator(model, cache, model.tokenizer, **kw)


def prompts(model, sizes, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, model.config.vocab_size, (n,), generator=gen).tolist() for n in sizes]


def logits(run: Run, ident) -> torch.Tensor:
    return torch.cat([r["logits"][0] for r in run.results[ident] if "logits" in r])


def assert_as_cold(model, run: Run, ident, prompt, new_tokens, **kw):
    """The job's tokens and logits are those of the same job on a fresh generator."""
    cold = Run(make_gen(model), [greedy_job(prompt, new_tokens, ident, return_logits=True, **kw)])
    assert run.ids(ident) == cold.ids(ident)
    assert cold.eos(ident)["cached_tokens"] == 0
    torch.testing.assert_close(logits(run, ident), logits(cold, ident), atol=1e-4, rtol=1e-4)


def turn(gen, prompt, new_tokens, ident, **kw) -> Run:
    return Run(gen, [greedy_job(prompt, new_tokens, ident, return_logits=True, **kw)])


def test_a_second_turn_resumes_from_the_snapshot_of_the_first(model):
    gen = make_gen(model)
    first_prompt, question = prompts(model, (37, 9), seed=1)
    first = turn(gen, first_prompt, 20, "first")
    history = first_prompt + first.ids("first")
    second_prompt = history + question
    second = turn(gen, second_prompt, 8, "second")
    # the first turn computed every token but its last: the state after them was kept when it ended
    assert second.eos("second")["cached_tokens"] == len(history) - 1
    assert_as_cold(model, second, "second", second_prompt, 8)
    # a prompt that leaves the first turn inside its last page resumes from the snapshot at that page's start
    edited = history[:-3] + question
    third = turn(gen, edited, 8, "edited")
    assert third.eos("edited")["cached_tokens"] == (len(history) - 4) // PAGE * PAGE
    assert_as_cold(model, third, "edited", edited, 8)
    assert gen.cache_manager.states.num_free == gen.cache.state.num_slots
    assert gen.page_table.referenced_pages() == []


def test_an_evicted_snapshot_falls_back_to_an_earlier_one_or_the_start(model):
    """One live slot and three snapshot slots: the last three states a job kept stay."""
    one = Cache(model, max_seq_len=PAGE, page_size=PAGE).state.bytes_per_slot
    gen = make_gen(model, state_bytes=one, snapshot_bytes=3 * one)
    base, tail_a, tail_b, tail_c = prompts(model, (70, 10, 6, 8), seed=2)
    turn(gen, base, 4, "base")  # boundaries 16, 32, 48, 64 and its end at 73: those at 48, 64 and 73 are kept
    shared = base[:56] + tail_a  # matches pages up to 48, which has its snapshot (now the most recent)
    run = turn(gen, shared, 4, "shared")
    assert run.eos("shared")["cached_tokens"] == 48
    assert_as_cold(model, run, "shared", shared, 4)
    # that job's own snapshot at 64 took the least recently used slot: the base prompt's at 64
    longer = base + tail_b
    run = turn(gen, longer, 4, "longer")
    assert run.eos("longer")["cached_tokens"] == 48
    assert_as_cold(model, run, "longer", longer, 4)
    early = base[:40] + tail_c  # pages 16 and 32 match, their snapshots are long gone
    run = turn(gen, early, 4, "early")
    assert run.eos("early")["cached_tokens"] == 0
    assert_as_cold(model, run, "early", early, 4)


class OracleDrafter(NgramDrafter):
    """Drafts the plain run's next tokens, with every third draft's last token wrong: verify steps that keep all
    drafts and steps that reject some, at every offset from a page boundary."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]], vocab_size: int):
        super().__init__(num_draft_tokens=5, max_q_size=8, vocab_size=vocab_size, max_ngram=1)
        self.answers = answers
        self.calls = 0

    def _draft(self, wanted):
        drafts = {}
        for seq, k in wanted:
            answer = self.answers.get(tuple(seq.tokens[: seq.prompt_len]), [])
            done = len(seq.tokens) - seq.prompt_len
            draft = list(answer[done : done + k])
            self.calls += 1
            if draft and self.calls % 3 == 0:
                draft[-1] = (draft[-1] + 1) % self.vocab_size
            drafts[seq.serial] = draft
        return drafts


@pytest.mark.parametrize("drafter", ["ngram", "draft_model", "oracle"])
def test_speculative_decoding_gives_the_tokens_of_plain_decoding(model, draft_model, drafter):
    jobs = [[5, 6, 7, 8] * 9, [10, 11, 12] * 4 + [40], *prompts(model, (23, 5), seed=3)]
    plain = Run(make_gen(model, max_chunk_size=13), [greedy_job(p, 30, i) for i, p in enumerate(jobs)])
    if drafter == "draft_model":
        gen = make_gen(model, draft=draft_model, max_chunk_size=13, num_draft_tokens=5)
    else:
        gen = make_gen(model, max_chunk_size=13, use_ngram_draft=True, max_ngram=3)
    if drafter == "oracle":
        answers = {tuple(p): plain.ids(i) for i, p in enumerate(jobs)}
        gen.drafter = OracleDrafter(answers, model.config.vocab_size)
        gen.drafter.room = gen.cache_manager.draft_room  # drafts stop at page boundaries
    spec = Run(gen, [greedy_job(p, 30, i) for i, p in enumerate(jobs)], arrivals=[0, 0, 1, 3])
    accepted = rejected = 0
    for i in range(len(jobs)):
        assert spec.ids(i) == plain.ids(i), f"job {i}: speculative tokens differ from plain decoding"
        accepted += spec.eos(i)["accepted_draft_tokens"]
        rejected += spec.eos(i)["rejected_draft_tokens"]
    assert rejected > 0  # verify steps whose state went back to before the drafts
    if drafter == "oracle":
        assert accepted > 60  # and steps that kept it
    assert gen.cache_manager.states.num_free == gen.cache.state.num_slots
    # what the speculative run left cached resumes a later prompt as a cold run would
    follow = jobs[0] + spec.ids(0) + [3, 4]
    again = turn(gen, follow, 6, "follow")
    assert again.eos("follow")["cached_tokens"] >= len(jobs[0]) + 16
    assert_as_cold(model, again, "follow", follow, 6)


def test_a_banned_string_rewind_restores_a_snapshot(model):
    prompt = prompts(model, (40,), seed=4)[0]
    plain = Run(make_gen(model), [greedy_job(prompt, 30, "plain")]).ids("plain")
    text = model.tokenizer.decode
    # ban the text of a token well past the next page boundary, whose text is whole and new there
    k = next(
        i
        for i in range(12, len(plain))
        if text(torch.tensor([plain[i]])).strip().isalpha()
        and text(torch.tensor([plain[i]])) not in text(torch.tensor(plain[:i]))
    )
    banned = text(torch.tensor([plain[k]]))
    gen = make_gen(model)
    restored: list[int] = []
    restore = gen.cache_manager._restore
    gen.cache_manager._restore = lambda seq, n: restored.append(restore(seq, n)) or restored[-1]
    run = turn(gen, prompt, k + 1, "banned", banned_strings=[banned])
    assert restored and all(r >= 32 for r in restored)  # the spare at 32 or a snapshot after it, not token 0
    # after the rewind the job computes what a cold job sees after the same tokens, and takes the next best
    cold = turn(make_gen(model), prompt + plain[:k], 1, "cold")
    row = logits(cold, "cold")[-1]
    torch.testing.assert_close(logits(run, "banned")[-1], row, atol=1e-4, rtol=1e-4)
    row[plain[k]] = float("-inf")
    assert run.ids("banned") == plain[:k] + [int(row.argmax())]


def test_a_job_gives_the_same_tokens_alone_and_in_a_ragged_batch(model):
    base = prompts(model, (50,), seed=5)[0]
    jobs = [base[:20] + [7] * 3, base + [9], *prompts(model, (3, 33, 17), seed=6), base[:45]]
    alone = [Run(make_gen(model), [greedy_job(p, 12, i)]).ids(i) for i, p in enumerate(jobs)]
    gen = make_gen(model, max_chunk_size=11)
    Run(gen, [greedy_job(base, 2, "warm")])  # snapshots of the shared prefix for the batch to resume from
    batch = Run(gen, [greedy_job(p, 12, i) for i, p in enumerate(jobs)], arrivals=[0, 0, 1, 1, 2, 4])
    assert [batch.ids(i) for i in range(len(jobs))] == alone
    assert batch.eos(1)["cached_tokens"] > 0


def test_a_cfg_pair_resumes_both_halves_and_gives_its_cold_tokens(model):
    pos, neg = prompts(model, (40, 27), seed=7)
    settings = SamplerSettings.greedy(cfg_scale=1.7)

    def pair(ident):
        return DynamicJob((torch.tensor([pos]), torch.tensor([neg])), 10, gen_settings=settings, identifier=ident)

    cold = Run(make_gen(model), [pair("cold")])
    gen = make_gen(model)
    Run(gen, [greedy_job(pos + [5], 2, "pos"), greedy_job(neg + [6], 2, "neg")])  # both prompts' pages, cached
    warm = Run(gen, [pair("warm")])
    assert warm.eos("warm")["cached_tokens"] == 32  # the positive half's, resumed at its last page boundary
    assert warm.ids("warm") == cold.ids("cold")
    assert gen.cache_manager.states.num_free == gen.cache.state.num_slots


def test_a_hybrid_draft_model_is_refused(model):
    with pytest.raises(ValueError, match="draft model with linear-attention"):
        make_gen(model, draft=model)
