"""The KV cache formats' rows of `python -m engine bench --only kv`: bytes, quality and speed of the 8-, 6- and
4-bit caches beside the unquantized one, on our engine, with llama.cpp's q8_0 and q4_0 caches on the same file.

    bytes:    the cache's bytes per token (scales included) over the unquantized cache's
    quality:  mean KL divergence of the next-token distribution from the bfloat16 cache's, over every
              position of one long real text read as one sequence (this project's docs, `text_ids`), with
              the model computing in float32 for both: in bfloat16 the arithmetic alone moves the
              distributions by more than an 8-bit cache does (two kernels over one bfloat16 cache differ by
              a mean KL of 0.0057 on the starter), and the figure would measure the rounding, not the cache
    speed:    one job over a long prompt (`--kv-context` tokens): prompt tokens/s, then decode tokens/s
              (new tokens - 1 over the time from the first token to the last; the best of three jobs, the
              other two served the prompt by the prefix cache)
    disk:     time to first token of a long prompt (`--kv-disk-tokens`) cold, and again from a new cache and
              generator over the same prompt-cache folder (as after a restart: only the files carry over); the
              disk holds full pages, so the tokens past the prompt's last full page, and its last token (which
              gives the logits), are computed again

llama.cpp's KL comes from its llama-perplexity tool (`--kl-divergence`, against its own float16 cache); it
scores the second half of each window of `--kv-window` tokens, so its positions see fewer tokens behind them
than ours do. It runs where the model is a .gguf file and the tool is found beside LLAMA_CPP_LIB_PATH or on PATH.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("engine.bench")

FORMATS = ("bf16", "q8", "q6", "q4")
# The budgets: (bytes per token vs the unquantized cache, mean KL)
BUDGETS = {"q8": (0.56, 0.005), "q6": (0.45, 0.015), "q4": (0.32, 0.06)}
LLAMA_TYPES = {"q8": "q8_0", "q4": "q4_0"}  # llama.cpp's nearest cache types
NOTE = (
    "KV rows: bytes per token include the scales; KL is the mean over every position of one long text read as one "
    "sequence, against our unquantized cache (llama.cpp's: the second half of each window, against its float16 "
    "cache); decode and prompt rates come from one greedy job over the long prompt."
)
DECODE_RUNS = 3
_CHUNK = 512  # tokens per forward while reading the text: bounds the logits held at once


def text_ids(tokenizer, num_tokens: int) -> tuple[list[int], str]:
    """`num_tokens` tokens of real English prose and code: this project's docs, repeated if short."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    files = sorted(docs.glob("*.md"))
    if not files:
        raise FileNotFoundError(f"the KV rows read the text of {docs}/*.md, which is missing: run from a checkout")
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in files)
    ids = tokenizer.encode_ids(text)
    while len(ids) < num_tokens:
        ids = ids + ids
    ids = ids[:num_tokens]
    return ids, tokenizer.decode(ids)


def _log_probs(model, ids: list[int], kv_format: str, page_size: int) -> list[torch.Tensor]:
    """The next-token log-probabilities at every position of `ids` read as one sequence, in chunks."""
    from engine.cache import Cache
    from engine.models import Batch

    pages = -(-len(ids) // page_size)
    dtype = torch.bfloat16 if kv_format == "bf16" else None  # quantized pages: attention in the model's dtype
    cache = Cache(model, pages * page_size, page_size=page_size, dtype=dtype, kv_format=kv_format)
    table, out = list(range(pages)), []
    with torch.inference_mode():
        for start in range(0, len(ids), _CHUNK):
            chunk = torch.tensor(ids[start : start + _CHUNK], device=model.device)
            batch = Batch.build(cache, [table], [start], [len(chunk)], logits="all")
            logits = model(chunk, batch.positions(), batch)
            out.append(torch.log_softmax(logits.float(), dim=-1).cpu())
    return out


def mean_kl(model, ids: list[int], formats=FORMATS[1:], page_size: int = 256) -> dict[str, float]:
    """Mean KL(bfloat16 cache || format) of the next-token distributions over `ids`, per format (`model` in
    float32, see the module docstring)."""
    reference = _log_probs(model, ids, "bf16", page_size)
    result = {}
    for kv_format in formats:
        test = _log_probs(model, ids, kv_format, page_size)
        total = sum(float((r.exp() * (r - t)).sum()) for r, t in zip(reference, test))
        result[kv_format] = total / len(ids)
    return result


def bytes_ratio(model, kv_format: str, page_size: int = 256) -> float:
    from engine.cache import Cache

    def per_token(name: str) -> int:
        return Cache(model, page_size, page_size=page_size, kv_format=name).bytes_per_token

    return per_token(kv_format) / per_token("bf16")


def _greedy(gen, ids: list[int], new_tokens: int) -> dict[str, Any]:
    """Run one greedy job of exactly `new_tokens` over the prompt `ids` to its end; its eos result."""
    from engine.generator.job import DynamicJob
    from engine.generator.sampler import SamplerSettings

    gen.enqueue(DynamicJob(ids, new_tokens, min_new_tokens=new_tokens, gen_settings=SamplerSettings.greedy()))
    ends = []
    while gen.num_remaining_jobs():
        ends += [r for r in gen.iterate() if r["eos"]]
    return ends[-1]


def speed(model, ids: list[int], kv_format: str, new_tokens: int, page_size: int = 256) -> dict[str, float]:
    """Prompt and decode tokens/s of greedy jobs over the prompt `ids` with a `kv_format` cache: the prompt rate
    from the first (cold) job, the decode rate the best of it and DECODE_RUNS - 1 more jobs over the same
    prompt, which the prefix cache serves (a single decode run of a few dozen tokens varies by 10-20% here)."""
    from engine.cache import Cache
    from engine.generator.dynamic import DynamicGenerator

    pages = -(-(len(ids) + new_tokens) // page_size) + 1  # and a page for the copy of a cached partial page
    cache = Cache(model, pages * page_size, page_size=page_size, kv_format=kv_format)
    gen = DynamicGenerator(model, cache, model.tokenizer)
    runs = [_greedy(gen, ids, new_tokens) for _ in range(DECODE_RUNS)]
    return {
        "prompt_tps": len(ids) / (runs[0]["time_enqueued"] + runs[0]["time_prefill"]),
        "decode_tps": max((r["new_tokens"] - 1) / r["time_generate"] for r in runs),
        "cached_tokens": runs[-1]["cached_tokens"],
    }


def _first_token_s(model, ids: list[int], folder: Path, page_size: int) -> tuple[float, int, str]:
    """(wall seconds to one greedy token, prompt tokens read from the cache, the token) with a fresh cache and
    generator whose disk tier is `folder`; the disk writes are flushed before returning."""
    from engine.cache import Cache
    from engine.generator.dynamic import DynamicGenerator

    pages = -(-(len(ids) + 1) // page_size)
    cache = Cache(model, pages * page_size, page_size=page_size, disk_dir=folder)
    gen = DynamicGenerator(model, cache, model.tokenizer)
    t0 = time.perf_counter()
    last = _greedy(gen, ids, 1)
    wall = time.perf_counter() - t0
    assert cache.disk is not None
    cache.disk.flush()
    cache.disk.close()
    return wall, last["cached_tokens"], last["full_completion"]


def disk_ttft(model, ids: list[int], page_size: int) -> dict[str, Any]:
    """Time to first token cold (best of 2, each into an empty folder) and from the disk tier (best of 2)."""
    with tempfile.TemporaryDirectory(prefix="tandem-kv-disk-") as tmp:
        cold = [_first_token_s(model, ids, Path(tmp) / f"cold{i}", page_size) for i in range(2)]
        warm = [_first_token_s(model, ids, Path(tmp) / "cold1", page_size) for _ in range(2)]
    return {
        "prompt_tokens": len(ids),
        "cold_s": min(c[0] for c in cold),
        "disk_s": min(w[0] for w in warm),
        "disk_cached_tokens": warm[-1][1],
        "same_token": all(w[2] == cold[0][2] for w in warm),
    }


def llama_perplexity() -> str | None:
    folder = os.environ.get("LLAMA_CPP_LIB_PATH")
    if folder and (Path(folder) / "llama-perplexity").exists():
        return str(Path(folder) / "llama-perplexity")
    return shutil.which("llama-perplexity")


def llama_cpp_kl(gguf: Path, text: str, window: int, threads: int | None) -> dict[str, float]:
    """llama.cpp's mean KL for its q8_0 and q4_0 caches against its float16 cache, on `text`."""
    tool = llama_perplexity()
    if tool is None or gguf.suffix != ".gguf":
        return {}
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tandem-kv-") as tmp:
        text_file, base = Path(tmp) / "text.txt", Path(tmp) / "base.kld"
        text_file.write_text(text, encoding="utf-8")
        common = [tool, "-m", str(gguf), "-f", str(text_file), "-c", str(window), "-b", str(window), "-fa", "on"]
        if threads:
            common += ["-t", str(threads)]
        _run([*common, "--kl-divergence-base", str(base)])
        for ours, theirs in LLAMA_TYPES.items():
            output = _run(
                [*common, "--kl-divergence-base", str(base), "--kl-divergence", "-ctk", theirs, "-ctv", theirs]
            )
            found = re.search(r"Mean\s+KLD:\s*([0-9.eE+-]+)", output or "")
            if found:
                result[ours] = float(found.group(1))
    return result


def _run(command: list[str]) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("llama-perplexity failed to run: %s", e)
        return None
    if done.returncode != 0:
        log.warning("llama-perplexity exited with %d: %s", done.returncode, done.stderr.strip()[-500:])
        return None
    return done.stdout + done.stderr


def measure(model, path: Path, args) -> dict[str, Any]:
    """Everything the rows show, as a JSON-ready dict: `model` (in the bench's dtype) for the speed rows, the
    same file in float32 for the quality rows."""
    from engine.models import Model

    quality_ids, text = text_ids(model.tokenizer, args.kv_text_tokens)
    log.info("kv: mean KL over %d tokens (float32 weights)", len(quality_ids))
    out: dict[str, Any] = {"text_tokens": len(quality_ids), "context": args.kv_context, "window": args.kv_window}
    exact = Model.load(path, device=args.device, dtype=torch.float32)
    out["kl"] = mean_kl(exact, quality_ids, page_size=args.page_size)
    del exact
    out["bytes_ratio"] = {name: bytes_ratio(model, name, args.page_size) for name in FORMATS}
    out["llama_cpp_kl"] = llama_cpp_kl(path, text, args.kv_window, args.threads)
    context_ids, _ = text_ids(model.tokenizer, args.kv_context)
    disk_ids, _ = text_ids(model.tokenizer, args.kv_disk_tokens)
    log.info("kv: a %d-token prompt cold, then from the disk tier", len(disk_ids))
    out["disk"] = disk_ttft(model, disk_ids, args.page_size)
    out["speed"] = {}
    for name in FORMATS:
        log.info("kv: %s cache, %d-token prompt, %d new tokens", name, len(context_ids), args.kv_new_tokens)
        out["speed"][name] = speed(model, context_ids, name, args.kv_new_tokens, args.page_size)
    return out


def rows(measured: dict[str, Any], fmt) -> list[dict[str, str]]:
    """The table rows: per format its bytes, KL (llama.cpp's beside it) and speed against the budgets."""
    table = []
    base = measured["speed"]["bf16"]
    for name in FORMATS[1:]:
        ratio, kl = measured["bytes_ratio"][name], measured["kl"][name]
        max_ratio, max_kl = BUDGETS[name]
        theirs = measured["llama_cpp_kl"].get(name)
        ok = ratio <= max_ratio and kl <= max_kl
        table.append(
            {
                "metric": f"KV {name.upper()}: mean KL vs bf16 cache ({measured['text_tokens']} tokens)",
                "ours": f"{kl:.4f} at {ratio:.2f}x bytes",
                "llama.cpp": "n/a" if theirs is None else f"{theirs:.4f} ({LLAMA_TYPES[name]})",
                "target": f"<= {max_kl} at <= {max_ratio}x",
                "result": f"{'PASS' if ok else 'MISS'}",
            }
        )
    for name in FORMATS:
        s = measured["speed"][name]
        table.append(
            {
                "metric": f"KV {name.upper()}: decode tok/s at {measured['context']} tokens",
                "ours": fmt(s["decode_tps"], "tok/s"),
                "target": "n/a" if name == "bf16" else ">= bf16",
                "result": "n/a" if name == "bf16" else _vs(s["decode_tps"], base["decode_tps"], 1.0),
            }
        )
        table.append(
            {
                "metric": f"KV {name.upper()}: prompt tok/s ({measured['context']} tokens)",
                "ours": fmt(s["prompt_tps"], "tok/s"),
                "target": "n/a" if name == "bf16" else ">= 0.9x bf16",
                "result": "n/a" if name == "bf16" else _vs(s["prompt_tps"], base["prompt_tps"], 0.9),
            }
        )
    table.append(_disk_row(measured["disk"], fmt))
    return table


def _disk_row(disk: dict[str, Any], fmt) -> dict[str, str]:
    share = disk["disk_s"] / disk["cold_s"]
    same = "same token" if disk["same_token"] else "a different first token"
    return {
        "metric": f"Prompt cache on disk: time to first token, {disk['prompt_tokens']} tokens (cold -> disk)",
        "ours": f"{fmt(disk['cold_s'], 'ms')} -> {fmt(disk['disk_s'], 'ms')} ({disk['disk_cached_tokens']} read, {same})",
        "target": "<= 1/4 of cold",
        "result": f"{'PASS' if share <= 0.25 and disk['same_token'] else 'MISS'} ({share:.2f}x)",
    }


def _vs(value: float, base: float, at_least: float) -> str:
    ratio = value / base if base else float("nan")
    return f"{'PASS' if ratio >= at_least else 'MISS'} ({ratio:.2f}x)"
