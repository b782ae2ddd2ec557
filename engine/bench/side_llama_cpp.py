"""llama.cpp's side of the bench, through llama-cpp-python (and its llama-batched-bench tool)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from engine.bench import llama_batched as bench_batched
from engine.bench import load as bench_load
from engine.bench import measure

log = logging.getLogger("engine.bench")


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """The same GGUF in llama-cpp-python, one sequence (its high-level API has no concurrent jobs), then N
    concurrent jobs through llama.cpp's own llama-batched-bench where it is found (engine/bench/llama_batched.py)."""
    from llama_cpp import Llama

    out: dict[str, Any] = {"rss_after_import_mib": measure.peak_rss_mib()}
    new, turn1, turn2 = cfg["new_tokens"], cfg["workload"]["turn1"], cfg["turn2"]
    t = time.perf_counter()
    llm = Llama(
        model_path=cfg["model"],
        n_ctx=max(len(turn2), len(cfg["workload"]["single"])) + new + 64,
        n_threads=cfg["threads"] or os.cpu_count(),
        verbose=False,
    )
    out["load_s"] = time.perf_counter() - t

    def first_token_s(ids: list[int]) -> float:
        t0 = time.perf_counter()
        stream = llm.generate(ids, temp=0.0)
        next(stream)
        stream.close()
        return time.perf_counter() - t0

    def decode_tps(ids: list[int]) -> float:
        llm.reset()
        times = []
        for token_idx, _ in enumerate(llm.generate(ids, temp=0.0)):
            times.append(time.perf_counter())
            if token_idx + 1 == new:
                break
        return (new - 1) / (times[-1] - times[0])

    single = cfg["workload"]["single"]
    log.info("llama.cpp: single-stream decode")
    first_token_s(single[:16])
    out["single_decode_tps"] = decode_tps(single)
    out["rss_after_single_mib"] = measure.peak_rss_mib()

    log.info("llama.cpp: chat turn 2, warm (turn 1's prompt in its cache) then cold")
    llm.reset()
    first_token_s(turn1)
    out["turn2_warm_ttft_s"] = first_token_s(turn2)  # generate() reuses the longest cached prefix

    def cold() -> float:
        llm.reset()
        return first_token_s(turn2)

    out["turn2_cold_ttft_s"] = measure.best_of(2, cold)
    out["prompt_tps"] = bench_load.prompt_rate(
        lambda ids: (llm.reset(), first_token_s(ids))[1], turn2[: bench_load.PROMPT_TOKENS]
    )
    out["peak_rss_mib"] = measure.peak_rss_mib()
    out["cpu_wait_share"] = measure.cpu_wait_share()  # before the busy loop below adds its own
    log.info("llama.cpp: single-stream decode with one core busy")
    with bench_load.busy_core():
        out["busy_decode_tps"] = decode_tps(single)
    tool = bench_batched.find_tool()
    if tool is not None:
        jobs = cfg["workload"]["jobs"]
        mean = round(sum(len(p) for p in jobs) / len(jobs))
        log.info("llama.cpp: %d concurrent jobs (%s, prompts of %d tokens)", len(jobs), tool.name, mean)
        batched = bench_batched.aggregate_rate(
            tool, cfg["model"], len(jobs), mean, new, cfg["threads"] or os.cpu_count()
        )
        if batched is not None:
            out["aggregate_tps"], out["batched_prompt_tokens"] = batched["aggregate_tps"], batched["prompt_tokens"]
    return out
