"""Hostile job arguments: each is refused with a ValueError naming the argument, or fails its job alone."""

from __future__ import annotations

import pytest
import torch

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator, JobFailure
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings

GREEDY = SamplerSettings.greedy()
PROMPT = torch.tensor([[5, 6, 7, 8]])


def make_gen(model, **kw):
    return DynamicGenerator(model, Cache(model, max_seq_len=32 * 16, page_size=16), model.tokenizer, **kw)


def run_all(gen) -> dict[object, list[dict]]:
    out: dict[object, list[dict]] = {}
    for _ in range(500):
        if not gen.num_remaining_jobs():
            break
        for r in gen.iterate():
            out.setdefault(r.get("identifier"), []).append(r)
    return out


def test_stop_conditions_string_or_int_is_refused_with_what_to_pass():
    with pytest.raises(ValueError, match=r"stop_conditions .*string 'abc'.*pass \['abc'\]"):
        DynamicJob(PROMPT, 4, stop_conditions="abc")
    with pytest.raises(ValueError, match=r"stop_conditions .*int 5.*pass \[5\]"):
        DynamicJob(PROMPT, 4, stop_conditions=5)
    with pytest.raises(ValueError, match="stop_conditions"):
        DynamicJob(PROMPT, 4, stop_conditions=5.0)
    with pytest.raises(ValueError, match="stop_conditions .*token id -3"):
        DynamicJob(PROMPT, 4, stop_conditions=[-3])
    job = DynamicJob(PROMPT, 4, stop_conditions=["abc", 2])  # the valid form is unchanged
    assert job.stop_strings == ("abc",) and job.stop_tokens == {2}


@pytest.mark.parametrize("value", [True, False, 2.0, "8", None])
def test_max_new_tokens_must_be_a_real_int(value):
    with pytest.raises(ValueError, match="max_new_tokens must be an int"):
        DynamicJob(PROMPT, value)


def test_counts_and_seed_are_checked_when_the_job_is_made():
    with pytest.raises(ValueError, match="min_new_tokens"):
        DynamicJob(PROMPT, 4, min_new_tokens=True)
    with pytest.raises(ValueError, match="max_skips"):
        DynamicJob(PROMPT, 4, max_skips=1.5)
    with pytest.raises(ValueError, match="seed"):  # refused at enqueue, not at admission inside iterate()
        DynamicJob(PROMPT, 4, seed=-1)
    with pytest.raises(ValueError, match="gen_settings must be a SamplerSettings"):
        DynamicJob(PROMPT, 4, gen_settings={"temperature": 0})


def test_token_ids_outside_the_vocabulary_are_refused_at_enqueue(tiny_model):
    gen = make_gen(tiny_model)
    vocab = tiny_model.config.vocab_size
    cases = {
        "stop_conditions": DynamicJob(PROMPT, 4, stop_conditions=[vocab + 7]),
        "token_bias": DynamicJob(PROMPT, 4, gen_settings=SamplerSettings(token_bias={vocab: 1.0})),
        "token_bias has": DynamicJob(PROMPT, 4, gen_settings=SamplerSettings(token_bias=torch.zeros(vocab + 1))),
        "disallowed_tokens": DynamicJob(PROMPT, 4, gen_settings=SamplerSettings(disallowed_tokens={vocab})),
    }
    for name, job in cases.items():
        with pytest.raises(ValueError, match=f"{name}.*vocabulary"):
            gen.enqueue(job)
    assert gen.num_remaining_jobs() == 0
    # The largest valid id still runs.
    ok = DynamicJob(PROMPT, 3, gen_settings=SamplerSettings.greedy(token_bias={vocab - 1: -1.0}), identifier=0)
    gen.enqueue(ok)
    assert run_all(gen)[0][-1]["eos"]


def test_cancel_refuses_another_generators_job(tiny_model):
    g1, g2 = make_gen(tiny_model), make_gen(tiny_model)
    mine = DynamicJob(PROMPT, 6, gen_settings=GREEDY, identifier="mine")
    theirs = DynamicJob(PROMPT, 6, gen_settings=GREEDY, identifier="theirs")
    g1.enqueue(mine)
    g2.enqueue(theirs)
    assert mine.serial == theirs.serial  # serials are per generator
    assert g1.cancel(theirs) is False
    assert g1.num_remaining_jobs() == 1 and g2.num_remaining_jobs() == 1
    assert run_all(g1)["mine"][-1]["eos"]
    with pytest.raises(ValueError, match="already enqueued on another generator"):
        g1.enqueue(theirs)
    assert g2.cancel(theirs) is True


def test_bad_dry_breakers_are_refused_when_the_job_is_made(tiny_model):
    with pytest.raises(ValueError, match="dry_sequence_breakers.*not valid text"):
        DynamicJob(PROMPT, 4, gen_settings=SamplerSettings(dry_multiplier=0.8, dry_sequence_breakers=("\udcff",)))
    with pytest.raises(ValueError, match="stop_conditions.*not valid text"):
        DynamicJob(PROMPT, 4, stop_conditions=["\udcff"])
    with pytest.raises(ValueError, match="banned_strings.*not valid text"):
        DynamicJob(PROMPT, 4, banned_strings=["ok", "\ud800x"])
    # Real characters still work, and the generator keeps serving.
    gen = make_gen(tiny_model)
    gen.enqueue(
        DynamicJob(PROMPT, 4, gen_settings=SamplerSettings(dry_multiplier=0.8, dry_sequence_breakers=("é",)), seed=1)
    )
    gen.enqueue(DynamicJob(PROMPT, 4, gen_settings=GREEDY, identifier=1))
    assert run_all(gen)[1][-1]["eos"]


class FailingTokenizer:
    """The generator's tokenizer, failing (with `error`) whenever it is asked to encode text holding `marker`.

    A real seam: DRY breakers are tokenised when a job is admitted, so a job with the marker as a breaker fails
    there while its batch-mates run on.
    """

    def __init__(self, tokenizer, marker: str, error: BaseException):
        self._tokenizer, self.marker, self.error = tokenizer, marker, error

    def encode(self, text, *args, **kwargs):
        if isinstance(text, str) and self.marker in text:
            raise self.error
        return self._tokenizer.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_failure_at_admission_fails_that_job_alone(tiny_model):
    tokenizer = FailingTokenizer(tiny_model.tokenizer, "\x07", RuntimeError("injected tokenizer failure"))
    gen = DynamicGenerator(tiny_model, Cache(tiny_model, max_seq_len=32 * 16, page_size=16), tokenizer)
    bad = SamplerSettings.greedy(dry_multiplier=0.5, dry_sequence_breakers=("\x07",))
    jobs = [DynamicJob(PROMPT + i, 5, gen_settings=GREEDY, identifier=i) for i in range(3)]
    jobs.insert(1, DynamicJob(PROMPT, 5, gen_settings=bad, identifier="bad"))
    gen.enqueue(jobs)
    with pytest.raises(JobFailure) as failure:
        gen.iterate()  # all four are admitted in this one call
    ((job, error),) = failure.value.failures
    assert job is jobs[1] and isinstance(error, ValueError) and "dry_sequence_breakers" in str(error)
    results = run_all(gen)
    for i in range(3):
        assert results[i][0]["stage"] == "started" and results[i][-1]["eos"]
        assert results[i][-1]["new_tokens"] == 5
    assert "bad" not in results
    assert gen.page_table.referenced_pages() == []


def test_results_of_an_iterate_that_raised_are_kept_for_the_next(tiny_model):
    gen = make_gen(tiny_model)
    no_logit = SamplerSettings(token_bias=torch.full((tiny_model.config.vocab_size,), -torch.inf))
    gen.enqueue(
        [DynamicJob(PROMPT, 1, gen_settings=GREEDY, identifier="ok"), DynamicJob(PROMPT, 3, gen_settings=no_logit)]
    )
    with pytest.raises(JobFailure, match="no finite logit"):
        gen.iterate()  # the good job's only token and its eos came out of this same call
    assert gen.num_remaining_jobs() == 1  # so `while num_remaining_jobs(): iterate()` still collects them
    results = run_all(gen)
    assert results["ok"][-1]["eos"] and results["ok"][-1]["new_tokens"] == 1
    assert gen.num_remaining_jobs() == 0
