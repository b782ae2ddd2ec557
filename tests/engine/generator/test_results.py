"""Every key a result dict carries is declared in `Result` (engine/generator/results.py), with its type.

Jobs run through the tiny model with the features that add keys turned on: a reasoning format (whose block
the prompt opens), probabilities, top tokens and logits, a stop string and a stop token that the model
really writes, a banned string it really writes (so a result undoes it), a choice filter, chunked prefill,
and n-gram speculation. A key written without a declaration fails here.
"""

from __future__ import annotations

import typing

import pytest
import torch

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.filters import ChoiceFilter
from engine.generator.job import DynamicJob
from engine.generator.results import Held, Result
from engine.generator.sampler import SamplerSettings
from engine.reasoning import ReasoningFormat

PAGE_SIZE = 16
THINK = ReasoningFormat()
DECLARED = typing.get_type_hints(Result)


def make_gen(model, **kw) -> DynamicGenerator:
    return DynamicGenerator(model, Cache(model, max_seq_len=64 * PAGE_SIZE, page_size=PAGE_SIZE), model.tokenizer, **kw)


def run(gen: DynamicGenerator, jobs: list[DynamicJob]) -> dict[object, list[Result]]:
    gen.enqueue(jobs)
    out: dict[object, list[Result]] = {job.identifier: [] for job in jobs}
    for _ in range(2000):
        if not gen.num_remaining_jobs():
            return out
        for r in gen.iterate():
            out[r["identifier"]].append(r)
    raise AssertionError("the generator did not finish")


def job(ids: list[int], ident: str, n: int = 24, **kw) -> DynamicJob:
    return DynamicJob(ids, n, gen_settings=SamplerSettings.greedy(), identifier=ident, **kw)


def check_declared(result: Result) -> None:
    """Each key is declared, and its value has the declared type."""
    for key, value in result.items():
        assert key in DECLARED, f"result key {key!r} is not declared in engine.generator.results.Result"
        hint = DECLARED[key]
        if typing.get_origin(hint) is typing.Literal:
            assert value in typing.get_args(hint), f"{key}={value!r} is none of {typing.get_args(hint)}"
        elif hint is Held:
            assert set(value) == set(typing.get_type_hints(Held)), f"held has keys {sorted(value)}"
        elif hint in (str, int, float, bool, torch.Tensor):
            assert isinstance(value, hint), f"{key} is {type(value).__name__}, declared {hint.__name__}"


@pytest.fixture(scope="module")
def prompt(tiny_model) -> list[int]:
    # ends in an opened reasoning block, so a job with a ReasoningFormat starts out thinking
    return tiny_model.tokenizer.encode("The quick brown fox <think>")[0].tolist()


def test_every_key_of_every_result_is_declared(tiny_model, prompt):
    plain = run(make_gen(tiny_model), [job(prompt, "plain")])["plain"]
    written = "".join(r.get("text", "") for r in plain)
    ids = [t for r in plain if "token_ids" in r for t in r["token_ids"][0].tolist()]
    assert len(written) > 12 and len(ids) > 8
    probes = [
        job(
            prompt,
            "features",
            reasoning=THINK,
            return_probs=True,
            return_top_tokens=3,
            return_logits=True,
            stop_conditions=[written[8:12]],
        ),
        job(prompt, "banned", reasoning=THINK, banned_strings=[written[4:7]]),
        job(prompt, "stop token", stop_conditions=[ids[5]]),
        job(prompt, "filtered", filters=[ChoiceFilter(["yes", "no"])]),
        job(prompt * 6, "chunked"),
    ]
    results = run(make_gen(tiny_model, max_chunk_size=PAGE_SIZE), probes)
    speculated = run(make_gen(tiny_model, use_ngram_draft=True), [job(prompt * 3, "speculated", reasoning=THINK)])
    every = [r for rs in (plain, *results.values(), *speculated.values()) for r in rs]
    for r in every:
        check_declared(r)
    seen = {key for r in every for key in r}
    # The probes really wrote the keys that only some jobs get, so the check above covered them.
    assert {
        "reasoning",
        "answer",
        "full_reasoning",
        "full_answer",
        "token_probs",
        "top_k_tokens",
        "logits",
        "suppressed_text",
        "eos_triggering_string",
        "eos_triggering_token_id",
        "curr_progress",
        "accepted_draft_tokens",
    } <= seen
    assert {r["eos_reason"] for r in every if r["eos"]} >= {"stop_string", "stop_token", "end_filter", "max_new_tokens"}


def test_speculated_results_stream_the_whole_split(tiny_model, prompt):
    """Several tokens merged into one result keep every token's reasoning and answer, not only the last's."""
    jobs = [job(prompt * 3, "speculated", n=40, reasoning=THINK)]
    results = run(make_gen(tiny_model, use_ngram_draft=True), jobs)["speculated"]
    streaming = [r for r in results if r["stage"] == "streaming"]
    eos = results[-1]
    assert eos["accepted_draft_tokens"] > 0 and any(r["token_ids"].shape[-1] > 1 for r in streaming)
    assert eos["full_reasoning"] and "".join(r["reasoning"] for r in streaming).strip() == eos["full_reasoning"]
    assert "".join(r["answer"] for r in streaming) == eos["full_answer"]
    assert "".join(r["text"] for r in streaming) == eos["full_completion"]
