"""transformers' side of the bench: `generate()` on the same model and prompts."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from engine.bench import measure

log = logging.getLogger("engine.bench")


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers
    from transformers.generation.streamers import BaseStreamer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    out: dict[str, Any] = {"rss_after_import_mib": measure.peak_rss_mib(), "version": transformers.__version__}
    device, new = cfg["device"], cfg["new_tokens"]
    path = Path(cfg["model"])
    dtype = measure.torch_dtype(cfg["dtype"])
    t = time.perf_counter()
    if path.is_file():
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model = model.to(device).eval()
    out["load_s"] = time.perf_counter() - t
    out["rss_after_load_mib"] = measure.peak_rss_mib()
    pad_id = model.generation_config.pad_token_id
    if pad_id is None:
        eos = model.generation_config.eos_token_id
        pad_id = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0

    class Clock(BaseStreamer):
        """Timestamps each put(); the first put is the prompt, each later one a new token."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value) -> None:
            measure.sync(device)
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    @torch.inference_mode()
    def generate(ids: list[list[int]], num_new: int, streamer=None) -> float:
        width = max(len(x) for x in ids)
        # Left padding, so every row's last prompt token is the last column.
        input_ids = torch.tensor([[pad_id] * (width - len(x)) + x for x in ids], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
        t0 = time.perf_counter()
        model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=num_new,
            min_new_tokens=num_new,
            do_sample=False,
            pad_token_id=pad_id,
            streamer=streamer,
        )
        measure.sync(device)
        return time.perf_counter() - t0

    single = cfg["workload"]["single"]
    log.info("transformers %s: warm-up and single-stream decode", transformers.__version__)
    generate([single[:16]], measure.WARMUP_TOKENS)
    runs = []
    for _ in range(measure.SINGLE_RUNS):
        clock = Clock()
        t0 = time.perf_counter()
        generate([single], new, clock)
        runs.append(((new - 1) / (clock.times[-1] - clock.times[1]), clock.times[1] - t0))
    out["single_decode_tps"] = max(tps for tps, _ in runs)
    out["single_ttft_s"] = min(ttft for _, ttft in runs)
    out["rss_after_single_mib"] = measure.peak_rss_mib()

    if cfg["hf_batched"]:
        prompts = cfg["workload"]["jobs"]
        log.info("transformers: padded batch of %d prompts", len(prompts))
        wall = generate(prompts, new)
        out["batched_tps"] = len(prompts) * new / wall
        out["rss_after_batched_mib"] = measure.peak_rss_mib()

    turn2 = cfg["turn2"]
    log.info("transformers: cold time to first token (%d prompt tokens)", len(turn2))
    out["turn2_cold_ttft_s"] = measure.best_of(2, lambda: generate([turn2], 1))
    out["peak_rss_mib"] = measure.peak_rss_mib()
    return out
