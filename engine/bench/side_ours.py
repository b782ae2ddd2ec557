"""Our engine's side of the bench (run in its own process by compare.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

from engine.bench import bound, measure, workload
from engine.bench import features as bench_features
from engine.bench import load as bench_load

log = logging.getLogger("engine.bench")


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from engine.models import Model

    out: dict[str, Any] = {"rss_after_import_mib": measure.peak_rss_mib()}
    t = time.perf_counter()
    model = Model.load(cfg["model"], device=cfg["device"], dtype=measure.torch_dtype(cfg["dtype"]))
    out["load_s"] = time.perf_counter() - t
    out["rss_after_load_mib"] = measure.peak_rss_mib()
    if "single" in cfg["workload"]:
        _ours_core(model, cfg, out)
    if "features" in cfg["workload"]:
        features = bench_features.measure(
            model, cfg["workload"]["features"], cfg["new_tokens"], cfg["draft_layers"], measure.SINGLE_RUNS
        )
        out.update(features)
    out["peak_rss_mib"] = measure.peak_rss_mib()
    return out


def _ours_core(model, cfg: dict[str, Any], out: dict[str, Any]) -> None:
    """Our side of the comparison phases, measurements into `out`."""
    import torch

    from engine.cache import Cache
    from engine.generator.dynamic import DynamicGenerator
    from engine.generator.job import DynamicJob
    from engine.generator.sampler import SamplerSettings

    device, new, page = cfg["device"], cfg["new_tokens"], cfg["page_size"]
    tokenizer = model.tokenizer

    def generator(num_tokens_per_job: list[int]) -> DynamicGenerator:
        pages = sum((n + page - 1) // page for n in num_tokens_per_job)
        return DynamicGenerator(model, Cache(model, max_seq_len=pages * page, page_size=page), tokenizer)

    def job(ids: list[int], num_new: int, **kw) -> DynamicJob:
        return DynamicJob(ids, num_new, min_new_tokens=num_new, gen_settings=SamplerSettings.greedy(), **kw)

    def drain(gen: DynamicGenerator, jobs: list[DynamicJob]) -> tuple[list[dict], float]:
        """Run jobs to the end; returns their final results (in job order) and the wall time."""
        t0 = time.perf_counter()
        gen.enqueue(jobs)
        last: dict[int, dict] = {}
        while gen.num_remaining_jobs():
            for r in gen.iterate():
                if r["eos"]:
                    last[r["serial"]] = r
        measure.sync(device)
        return [last[j.serial] for j in jobs], time.perf_counter() - t0

    single = cfg["workload"]["single"]
    log.info("ours: warm-up and single-stream decode (%d prompt tokens, %d new)", len(single), new)
    drain(generator([16 + measure.WARMUP_TOKENS]), [job(single[:16], measure.WARMUP_TOKENS)])
    runs = []
    for _ in range(measure.SINGLE_RUNS):  # a fresh cache each time, so no run reuses another's prompt
        (r,), _ = drain(generator([len(single) + new]), [job(single, new)])
        runs.append(((r["new_tokens"] - 1) / r["time_generate"], r["time_enqueued"] + r["time_prefill"]))
    out["single_decode_tps"] = max(tps for tps, _ in runs)
    out["active_bytes"], out["read_gbs"] = bound.active_bytes(model), bound.read_bandwidth_gbs()
    out["single_ttft_s"] = min(ttft for _, ttft in runs)
    out["rss_after_single_mib"] = measure.peak_rss_mib()

    prompts = cfg["workload"]["jobs"]
    log.info("ours: %d concurrent jobs (prompts %d..%d tokens)", len(prompts), len(prompts[0]), len(prompts[-1]))
    gen = generator([len(p) + new for p in prompts])
    results, wall = drain(gen, [job(p, new) for p in prompts])
    out["aggregate_tps"] = sum(r["new_tokens"] for r in results) / wall
    out["aggregate_wall_s"] = wall
    out["rss_after_aggregate_mib"] = measure.peak_rss_mib()
    del gen

    turn1 = cfg["workload"]["turn1"]
    log.info("ours: chat turn 1 (%d prompt tokens)", len(turn1))
    # Room for turn 1 (kept cached after it ends) and for turn 2's new pages beside it.
    gen = generator([len(turn1) + workload.ANSWER_TOKENS, len(turn1) + workload.ANSWER_TOKENS + 512])
    stops = sorted(tokenizer.eos_token_ids)
    first = DynamicJob(turn1, workload.ANSWER_TOKENS, gen_settings=SamplerSettings.greedy(), stop_conditions=stops)
    (r1,), _ = drain(gen, [first])
    messages = cfg["workload"]["turn1_messages"] + [
        {"role": "assistant", "content": r1["full_completion"]},
        {"role": "user", "content": workload.FOLLOW_UP},
    ]
    turn2 = workload.chat_ids(tokenizer, messages)
    out["turn2"] = turn2
    log.info("ours: chat turn 2 (%d prompt tokens), warm then cold", len(turn2))
    (r2,), warm = drain(gen, [job(turn2, 1)])
    out["turn2_warm_ttft_s"] = warm
    out["turn2_cached_tokens"] = r2["cached_tokens"]

    def cold() -> float:
        fresh = generator([len(turn2) + 1])
        return drain(fresh, [job(turn2, 1)])[1]

    out["turn2_cold_ttft_s"] = measure.best_of(2, cold)

    prompt = turn2[: bench_load.PROMPT_TOKENS]
    out["prompt_tokens"] = len(prompt)
    out["prompt_tps"] = bench_load.prompt_rate(lambda ids: drain(generator([len(ids) + 1]), [job(ids, 1)])[1], prompt)
    out["cpu_wait_share"] = measure.cpu_wait_share()  # before the busy loop below adds its own
    out["threads"] = torch.get_num_threads()  # before the thread policy answers the busy loop
    log.info("ours: single-stream decode with one core busy")
    with bench_load.busy_core():
        drain(
            generator([16 + measure.WARMUP_TOKENS]), [job(single[:16], measure.WARMUP_TOKENS)]
        )  # the thread policy adapts
        (r,), _ = drain(generator([len(single) + new]), [job(single, new)])
    out["busy_decode_tps"] = (r["new_tokens"] - 1) / r["time_generate"]
