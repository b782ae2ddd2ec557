"""generate(): complete prompts in one call, on top of a generator's enqueue / iterate / cancel.

A plain function over the small `Generating` protocol, so it needs nothing of the generator's insides;
DynamicGenerator.generate() (the seed documents' method) calls it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

from engine.generator.filters import Filter
from engine.generator.job import DynamicJob
from engine.generator.results import Result
from engine.generator.sampler import SamplerSettings

# One prompt gives a string, a list of prompts a list; with return_last_results each comes with its eos result.
GenerateOutput = str | list[str] | tuple[str, Result | None] | tuple[list[str], list[Result | None]]


class Generating(Protocol):
    """What generate() drives: DynamicGenerator is one."""

    tokenizer: Any

    def enqueue(self, job: DynamicJob | Sequence[DynamicJob]) -> int | list[int]: ...

    def iterate(self) -> list[Result]: ...

    def cancel(self, job: DynamicJob) -> bool: ...

    def keep_results(self, results: list[Result]) -> None:
        """Hand back other jobs' results read while waiting; the next iterate() returns them first."""


def generate(
    generator: Generating,
    prompt: str | Sequence[str],
    max_new_tokens: int,
    min_new_tokens: int = 0,
    seed: int | None = None,
    gen_settings: SamplerSettings | Sequence[SamplerSettings] | None = None,
    token_healing: bool = False,
    encode_special_tokens: bool = False,
    decode_special_tokens: bool = False,
    stop_conditions: Sequence[int | str] | None = None,
    add_bos: bool = False,
    abort_event: threading.Event | None = None,
    completion_only: bool = False,
    embeddings: Sequence[Any] | None = None,
    banned_strings: Sequence[str] | None = None,
    return_last_results: bool = False,
    filters: Sequence[Filter] | None = None,
    filter_prefer_eos: bool = False,
) -> GenerateOutput:
    """Complete one prompt (returns a string) or a list (returns a list), waiting only for these jobs.

    Other jobs keep running; their results are kept for the next iterate() call. `filters` apply to every
    prompt (filters keep no per-job state).
    """
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    settings = list(gen_settings) if isinstance(gen_settings, (list, tuple)) else [gen_settings] * len(prompts)
    if len(settings) != len(prompts):
        raise ValueError(f"{len(settings)} gen_settings for {len(prompts)} prompts; pass one or one per prompt")
    jobs = []
    for i, (p, s) in enumerate(zip(prompts, settings)):
        ids = generator.tokenizer.encode(p, add_bos=add_bos, encode_special_tokens=encode_special_tokens)
        jobs.append(
            DynamicJob(
                ids,
                max_new_tokens,
                min_new_tokens=min_new_tokens,
                gen_settings=s,
                seed=None if seed is None else seed + i,
                stop_conditions=stop_conditions,
                decode_special_tokens=decode_special_tokens,
                token_healing=token_healing,
                identifier=i,
                banned_strings=banned_strings,
                embeddings=embeddings,
                filters=filters,
                filter_prefer_eos=filter_prefer_eos,
            )
        )
    generator.enqueue(jobs)
    mine = {j.serial for j in jobs}
    completions = [""] * len(jobs)
    last: list[Result | None] = [None] * len(jobs)
    others: list[Result] = []
    try:
        while any(j.generator is generator for j in jobs):  # enqueued here, not ended or cancelled
            if abort_event is not None and abort_event.is_set():
                break
            for r in generator.iterate():
                if r["serial"] not in mine:
                    others.append(r)
                    continue
                i = r["identifier"]
                completions[i] += r.get("text", "")
                if r["eos"]:
                    last[i] = r
    finally:
        for j in jobs:
            generator.cancel(j)
        generator.keep_results(others)
    if not completion_only:
        completions = [p + c for p, c in zip(prompts, completions)]
    out: Any = completions[0] if isinstance(prompt, str) else completions
    if return_last_results:
        return out, (last[0] if isinstance(prompt, str) else last)
    return out
