"""The feature rows of `python -m engine bench`: speculative decoding and constrained output, our engine only.

    speculation:  one prompt that quotes code and asks for it back (so the answer repeats the context),
                  greedy, the same number of new tokens each run:
                  no speculation | n-gram drafts | self-speculation drafts (the model's first k layers)
    constrained:  one prompt asking for a person as JSON, greedy:
                  JSONFilter(small object schema) until the filter ends it, then the same job unconstrained
                  for exactly as many tokens, so both decode the same length

Decode rates are (new tokens - 1) / time from first to last token, best of `runs` (of at least
MIN_JSON_RUNS for the short JSON answer). Acceptance is
accepted / (accepted + rejected) drafted tokens from the eos result. The output of every speculative run
is compared with the plain run's. They should be identical, and were in float32 runs; in bfloat16 a verify
forward over several tokens rounds differently from a one-token decode step, so a near-tie can flip a greedy
token, and the row then says where the texts part.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("engine.bench")

DEPARTS_NOTE = (
    "Speculative greedy output matched plain decoding in float32 runs. In bfloat16 the verify forward "
    "(several tokens at once) rounds differently from a one-token decode step, so a near-tie between two "
    "tokens can go the other way; where that happened the row says at which character the texts part."
)

NUM_DRAFT_TOKENS = 4
MAX_NGRAM = 4
MIN_JSON_RUNS = 5  # the JSON answer is a few dozen tokens: more runs, so noise does not pose as overhead

SPEC_CODE = '''def fibonacci(n):
    """Return the first n Fibonacci numbers."""
    numbers = [0, 1]
    while len(numbers) < n:
        numbers.append(numbers[-1] + numbers[-2])
    return numbers[:n]


def is_prime(n):
    if n < 2:
        return False
    for i in range(2, int(n ** 0.5) + 1):
        if n % i == 0:
            return False
    return True
'''
SPEC_REQUEST = "Copy this Python code exactly, then add a docstring to is_prime:\n\n```python\n" + SPEC_CODE + "```"
JSON_REQUEST = "Describe a fictional person as a JSON object with name, age, city and hobbies."
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "hobbies": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "city", "hobbies"],
}


def build_prompts(chat_ids: Callable[[list[dict]], list[int]]) -> dict[str, list[int]]:
    """Token ids of the two feature prompts; `chat_ids(messages)` renders and encodes a conversation."""
    return {
        "spec": chat_ids([{"role": "user", "content": SPEC_REQUEST}]),
        "json": chat_ids([{"role": "user", "content": JSON_REQUEST}]),
    }


# ----------------------------------------------------------------------------------------------- measuring


def _run_one(model, prompt: list[int], num_new: int, runs: int, draft_layers: int | None = None, **kw) -> dict:
    """The fastest of `runs` runs of one greedy job in a fresh generator; its eos result plus "tps"."""
    import torch

    from engine.cache import Cache
    from engine.generator.dynamic import DynamicGenerator
    from engine.generator.job import DynamicJob
    from engine.generator.sampler import SamplerSettings
    from engine.models.layer_skip import truncated_draft

    page = 256
    gen_kw = {k: kw.pop(k) for k in ("use_ngram_draft", "max_ngram", "num_draft_tokens") if k in kw}
    best: dict | None = None
    for _ in range(runs):
        size = (len(prompt) + num_new + page - 1) // page * page
        cache = Cache(model, max_seq_len=size, page_size=page)
        if draft_layers is not None:
            draft = truncated_draft(model, draft_layers)
            gen_kw["draft_model"], gen_kw["draft_cache"] = (
                draft,
                Cache(draft, size, page_size=page, sliding_tokens=size),
            )
        gen = DynamicGenerator(model, cache, model.tokenizer, **gen_kw)
        gen.enqueue(DynamicJob(prompt, num_new, gen_settings=SamplerSettings.greedy(), **kw))
        last = None
        while gen.num_remaining_jobs():
            for r in gen.iterate():
                if r["eos"]:
                    last = r
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        n, t = last["new_tokens"], last["time_generate"]
        last["tps"] = (n - 1) / t if n > 1 and t > 0 else math.nan
        if best is None or last["tps"] > best["tps"]:
            best = last
    return best


def _departs_at(result: dict, plain: dict) -> int | None:
    """The first character where a speculative run's text differs from plain decoding's; None when equal."""
    a, b = result["full_completion"], plain["full_completion"]
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _acceptance(result: dict) -> float:
    accepted, rejected = result.get("accepted_draft_tokens", 0), result.get("rejected_draft_tokens", 0)
    return accepted / (accepted + rejected) if accepted + rejected else math.nan


def measure(model, prompts: dict[str, list[int]], new_tokens: int, draft_layers: list[int], runs: int) -> dict:
    """Run the speculation and constrained-output phases on `model`; a flat dict of measurements."""
    from engine.generator.filters import JSONFilter

    out: dict[str, Any] = {"num_layers": model.config.num_hidden_layers}
    spec = prompts["spec"]
    # min_new_tokens: every run decodes the same number of tokens, whatever the model would stop at.
    same = {"min_new_tokens": new_tokens}
    log.info("ours: speculation (%d prompt tokens, %d new), no speculation", len(spec), new_tokens)
    t = time.perf_counter()
    plain = _run_one(model, spec, new_tokens, runs, **same)
    out["spec_plain_tps"] = plain["tps"]

    log.info("ours: n-gram speculation")
    ngram = _run_one(model, spec, new_tokens, runs, use_ngram_draft=True, max_ngram=MAX_NGRAM, **same)
    out["spec_ngram_tps"], out["spec_ngram_acceptance"] = ngram["tps"], _acceptance(ngram)
    out["spec_ngram_departs_at"] = _departs_at(ngram, plain)

    out["spec_drafts"] = []
    for k in draft_layers:
        if not 1 <= k < out["num_layers"]:
            log.warning("skipping a %d-layer draft: the model has %d layers", k, out["num_layers"])
            continue
        log.info("ours: self-speculation draft, first %d of %d layers", k, out["num_layers"])
        r = _run_one(model, spec, new_tokens, runs, draft_layers=k, num_draft_tokens=NUM_DRAFT_TOKENS, **same)
        out["spec_drafts"].append(
            {
                "layers": k,
                "tps": r["tps"],
                "acceptance": _acceptance(r),
                "departs_at": _departs_at(r, plain),
            }
        )
    out["spec_s"] = time.perf_counter() - t

    log.info("ours: constrained JSON output, then the same length unconstrained")
    prompt, stops = prompts["json"], sorted(model.tokenizer.eos_token_ids)
    json_runs = max(runs, MIN_JSON_RUNS)
    constrained = _run_one(
        model, prompt, new_tokens, json_runs, filters=[JSONFilter(JSON_SCHEMA)], stop_conditions=stops
    )
    n = constrained["new_tokens"]
    free = _run_one(model, prompt, n, json_runs, min_new_tokens=n)
    out["json_tps"], out["json_free_tps"], out["json_new_tokens"] = constrained["tps"], free["tps"], n
    out["json_eos_reason"] = constrained["eos_reason"]
    out["json_completion"] = constrained["full_completion"]
    return out


# ----------------------------------------------------------------------------------------------- the table


def departed(ours: dict) -> bool:
    """Whether any speculative run's text parted from plain decoding (the table then explains why)."""
    runs = [ours.get("spec_ngram_departs_at"), *(d.get("departs_at") for d in ours.get("spec_drafts", []))]
    return any(r is not None for r in runs)


def rows(ours: dict, new_tokens: int, fmt: Callable[[Any, str], str], columns: list[str]) -> list[dict[str, str]]:
    """The feature rows: metric, ours, n/a in each of the other sides' `columns`, target, result.

    `fmt(value, unit)` formats a cell as the rest of the table does.
    """

    def row(metric: str, value: Any, unit: str, result: str = "") -> dict[str, str]:
        others = {c: "n/a" for c in columns}
        return {"metric": metric, "ours": fmt(value, unit), **others, "target": "", "result": result}

    def vs(tps: float | None, base: float | None) -> str:
        if tps is None or not base or math.isnan(tps) or math.isnan(base):
            return "n/a"
        return f"{tps / base:.2f}x no speculation"

    def accepted(value: float | None) -> str:
        return "no drafts" if value is None or math.isnan(value) else f"{value * 100:.0f}% of drafts accepted"

    def same(departs_at: int | None) -> str:
        return "" if departs_at is None else f"; output departs from plain decoding at character {departs_at}"

    base = ours.get("spec_plain_tps")
    layers = ours.get("num_layers", "?")
    out = [
        row(f"speculation prompt (quotes code, asks it back), no speculation, tok/s ({new_tokens} new, greedy)",
            base, "tok/s"),
        row(f"  n-gram speculation (max_ngram {MAX_NGRAM})", ours.get("spec_ngram_tps"), "tok/s",
            f"{vs(ours.get('spec_ngram_tps'), base)}; {accepted(ours.get('spec_ngram_acceptance'))}"
            + same(ours.get("spec_ngram_departs_at"))),
    ]  # fmt: skip
    for d in ours.get("spec_drafts", []):
        out.append(
            row(
                f"  self-speculation draft: first {d['layers']} of {layers} layers, {NUM_DRAFT_TOKENS} draft tokens",
                d["tps"],
                "tok/s",
                f"{vs(d['tps'], base)}; {accepted(d['acceptance'])}" + same(d.get("departs_at")),
            )
        )
    free, constrained = ours.get("json_free_tps"), ours.get("json_tps")
    overhead = "n/a"
    if free and constrained and not math.isnan(free) and not math.isnan(constrained):
        overhead = f"{(free / constrained - 1) * 100:+.0f}% time per token"  # per-token time ratio - 1
    n = ours.get("json_new_tokens", "?")
    out += [
        row(f"JSON prompt, unconstrained, tok/s ({n} new, greedy)", free, "tok/s"),
        row(f"  constrained by a JSON schema (JSONFilter; ended by {ours.get('json_eos_reason', '?')})",
            constrained, "tok/s", overhead),
    ]  # fmt: skip
    return out
