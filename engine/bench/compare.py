"""`python -m engine bench`: our engine vs transformers' `generate()` on the same model, dtype and prompts.

    parent: build the prompts once (token ids) -> run each side in its own subprocess, one after another
            -> print one table (stdout), progress on stderr, optionally --json
    worker: load the model, run the phases, write its measurements (and its own peak RSS) to a JSON file

Each side runs in its own process so that its peak RSS is its own and neither warms the other's caches.
Phases: single-stream decode, 16 concurrent jobs, a second chat turn over a long shared history vs cold
("core"); then, on our engine only, speculative decoding and constrained JSON output ("features", see
engine/bench/features.py). `--only core` or `--only features` runs one group.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.bench import features as bench_features
from engine.bench import llama_batched as bench_batched
from engine.bench import load as bench_load

log = logging.getLogger("engine.bench")  # not __name__: the workers run this file as __main__

DTYPES = ("bfloat16", "float16", "float32")
GROUPS = ("all", "core", "features")
DEFAULT_DRAFT_LAYERS = "8,16"
ANSWER_TOKENS = 64  # length cap of the first chat turn's answer
WARMUP_TOKENS = 4
BUSY_WAIT_SHARE = 0.10  # above this share of time waiting for a CPU, the timings are called unreliable
SINGLE_RUNS = 2  # single-stream figures are the best of this many runs (other processes add noise)

# Plain sentences the prompts are made of; mixed so the model sees ordinary text, shuffled per prompt so
# no two prompts share a prefix beyond the chat template (which would let our prefix cache skip work).
SENTENCES = [
    "The river had frozen early that year, and the ferry stayed tied to the dock until spring.",
    "She kept a notebook of every bird she saw, with the date, the weather and a small sketch.",
    "Compilers turn source text into tokens, then into a tree, and only then into machine code.",
    "A good soup starts with onions cooked slowly in butter until they turn sweet and golden.",
    "The library opened at nine, but the queue for the reading room began to form at eight.",
    "Most of the mountain path was gravel, though the last mile climbed over bare granite.",
    "He explained that interest compounds, so small savings made early grow more than large late ones.",
    "The orchestra tuned to the oboe, as orchestras have done for more than two hundred years.",
    "Rain fell on the tin roof all night, steady and loud, and nobody in the cabin slept much.",
    "To repot a plant, water it the day before so the roots slide out of the old pot in one piece.",
    "The museum's oldest map shows the coast drawn by hand, with sea monsters in the empty parts.",
    "Every morning the baker checked the starter, fed it flour and water, and wrote the time down.",
    "Trains in the valley ran every hour, and the last one left the station just before midnight.",
    "The committee met twice, argued for an hour each time, and finally agreed to plant more trees.",
    "Light from the nearest star other than the sun takes a little over four years to reach us.",
    "The old clock in the hall lost two minutes a week, so someone reset it every Sunday evening.",
]
QUESTIONS = [
    "Can you tell me more about this?",
    "What would you do next in that situation?",
    "Please explain that in simpler words.",
    "Why does that happen, do you think?",
]
FOLLOW_UP = "Thank you. Now summarize our whole conversation in two sentences."


# ----------------------------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `bench` options to `parser` (the `python -m engine bench` subcommand)."""
    parser.add_argument(
        "model", nargs="?", default="starter", help="a model folder, a .gguf file, or 'starter' (the default)"
    )
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="weights dtype for both sides")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both sides)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens per job (greedy, never stops early)")
    parser.add_argument("--jobs", type=int, default=16, help="concurrent jobs in the aggregate phase")
    parser.add_argument("--max-prompt-tokens", type=int, default=512, help="longest prompt in the job mix")
    parser.add_argument("--history-tokens", type=int, default=1500, help="chat history before the second turn")
    parser.add_argument("--page-size", type=int, default=256, help="our KV cache page size (tokens)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads for both sides (default: torch's choice)"
    )
    parser.add_argument("--skip-transformers", action="store_true", help="run our rows only")
    parser.add_argument(
        "--hf-batched",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time transformers generate() on the job mix as one padded batch (default: on)",
    )
    parser.add_argument(
        "--only",
        choices=GROUPS,
        default="all",
        help="core: the comparison rows; features: speculation and constrained output on our engine only "
        "(no transformers or llama.cpp run); all: both (the default)",
    )
    parser.add_argument(
        "--draft-layers",
        default=DEFAULT_DRAFT_LAYERS,
        metavar="K,K",
        help=f"self-speculation draft depths to time, comma-separated (default {DEFAULT_DRAFT_LAYERS}; "
        "an empty string times none); depths the model does not have are skipped",
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the measurements as JSON")


def _check_args(args: argparse.Namespace) -> None:
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    for name in ("new_tokens", "jobs", "max_prompt_tokens", "history_tokens", "page_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.new_tokens < 2:
        raise ValueError("--new-tokens must be >= 2: the decode rate is measured after the first token")
    draft_layers(args)


def draft_layers(args: argparse.Namespace) -> list[int]:
    """The --draft-layers depths as ints (ValueError naming the bad part)."""
    depths = []
    for part in str(args.draft_layers).split(","):
        if not part.strip():
            continue
        try:
            depth = int(part)
        except ValueError:
            depth = 0
        if depth < 1:
            raise ValueError(f"--draft-layers takes positive layer counts such as 8,16; got {part.strip()!r}")
        depths.append(depth)
    return depths


def _groups(args: argparse.Namespace) -> tuple[bool, bool]:
    """(run the core phases, run the feature phases)."""
    return args.only in ("all", "core"), args.only in ("all", "features")


def _model_path(spec: str) -> Path:
    if spec == "starter":
        from engine.loading.starter import fetch_starter

        return fetch_starter()
    path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(f"{path} does not exist; give a model folder, a .gguf file, or 'starter'")
    return path


# ----------------------------------------------------------------------------------------------- prompts


def _chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    from engine.chat_template import ChatTemplate

    text = ChatTemplate.from_tokenizer(tokenizer).render(messages, add_generation_prompt=True)
    return tokenizer.encode_ids(text, encode_special_tokens=True)


def _text_until(tokenizer, target_tokens: int, seed: int, question: str) -> list[dict]:
    """One user message of shuffled sentences plus a question, about `target_tokens` long once rendered.

    Sentence `seed` goes first, so messages with different seeds differ from their first sentence on.
    """
    first = SENTENCES[seed % len(SENTENCES)]
    order = [s for s in SENTENCES if s != first]
    random.Random(seed).shuffle(order)
    order.insert(0, first)
    words: list[str] = []
    while True:
        words.append(order[len(words) % len(order)])
        messages = [{"role": "user", "content": " ".join(words) + " " + question}]
        if len(_chat_ids(tokenizer, messages)) >= target_tokens:
            return messages


def _history(tokenizer, target_tokens: int) -> list[dict]:
    """Alternating user/assistant turns until the rendered conversation (plus a question) is long enough."""
    rng = random.Random(1234)
    messages: list[dict] = []
    while True:
        question = QUESTIONS[len(messages) // 2 % len(QUESTIONS)]
        turn = [{"role": "user", "content": question}]
        if len(_chat_ids(tokenizer, messages + turn)) >= target_tokens:
            return messages + turn
        reply = " ".join(rng.sample(SENTENCES, 5))
        messages += [*turn, {"role": "assistant", "content": reply}]


def build_workload(tokenizer, args: argparse.Namespace) -> dict[str, Any]:
    """Token ids every side runs: one single-stream prompt, the job mix, and the first chat turn; plus
    the feature prompts ("features") when --only asks for them. Without the core group, only the latter."""
    core, features = _groups(args)
    workload: dict[str, Any] = {}
    if features:
        workload["features"] = bench_features.build_prompts(lambda messages: _chat_ids(tokenizer, messages))
    if core:
        workload.update(_core_workload(tokenizer, args))
    return workload


def _core_workload(tokenizer, args: argparse.Namespace) -> dict[str, Any]:
    n = args.jobs
    lo = min(32, args.max_prompt_tokens)
    lengths = [lo + (args.max_prompt_tokens - lo) * i // max(n - 1, 1) for i in range(n)]
    jobs = [
        _chat_ids(tokenizer, _text_until(tokenizer, length, i, QUESTIONS[i % len(QUESTIONS)]))
        for i, length in enumerate(lengths)
    ]
    single = _chat_ids(tokenizer, _text_until(tokenizer, 64, 99, "Write a story about it."))
    history = _history(tokenizer, args.history_tokens)
    return {"single": single, "jobs": jobs, "turn1_messages": history, "turn1": _chat_ids(tokenizer, history)}


# ----------------------------------------------------------------------------------------------- measuring


def _peak_rss_mib() -> float:
    """This process's peak resident memory so far (MiB), or NaN where the OS does not say."""
    try:
        import resource
    except ImportError:  # Windows
        return math.nan
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


_SCHED_AT_START: dict[str, tuple[int, int]] = {}  # a side's threads' scheduler times when its run began


def _sched_times() -> dict[str, tuple[int, int]]:
    """Per thread of this process: (ns on a CPU, ns runnable but waiting for one). Empty off Linux."""
    times = {}
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        try:
            on_cpu, waiting = stat.read_text().split()[:2]
        except (OSError, ValueError):  # the thread ended meanwhile
            continue
        times[stat.parent.name] = (int(on_cpu), int(waiting))
    return times


def _cpu_wait_share(before: dict[str, tuple[int, int]]) -> float:
    """Share of this process's runnable time since `before` spent waiting for a CPU (other load), or NaN."""
    on_cpu = waiting = 0
    for tid, (run, wait) in _sched_times().items():
        run0, wait0 = before.get(tid, (0, 0))
        on_cpu, waiting = on_cpu + run - run0, waiting + wait - wait0
    return waiting / (on_cpu + waiting) if on_cpu + waiting else math.nan


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _best_of(n: int, fn) -> float:
    return min(fn() for _ in range(n))


# ----------------------------------------------------------------------------------------------- our engine


def _ours(cfg: dict[str, Any]) -> dict[str, Any]:
    from engine.models import Model

    out: dict[str, Any] = {"rss_after_import_mib": _peak_rss_mib()}
    t = time.perf_counter()
    model = Model.load(cfg["model"], device=cfg["device"], dtype=_torch_dtype(cfg["dtype"]))
    out["load_s"] = time.perf_counter() - t
    out["rss_after_load_mib"] = _peak_rss_mib()
    if "single" in cfg["workload"]:
        _ours_core(model, cfg, out)
    if "features" in cfg["workload"]:
        features = bench_features.measure(
            model, cfg["workload"]["features"], cfg["new_tokens"], cfg["draft_layers"], SINGLE_RUNS
        )
        out.update(features)
    out["peak_rss_mib"] = _peak_rss_mib()
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
        _sync(device)
        return [last[j.serial] for j in jobs], time.perf_counter() - t0

    single = cfg["workload"]["single"]
    log.info("ours: warm-up and single-stream decode (%d prompt tokens, %d new)", len(single), new)
    drain(generator([16 + WARMUP_TOKENS]), [job(single[:16], WARMUP_TOKENS)])
    runs = []
    for _ in range(SINGLE_RUNS):  # a fresh cache each time, so no run reuses another's prompt
        (r,), _ = drain(generator([len(single) + new]), [job(single, new)])
        runs.append(((r["new_tokens"] - 1) / r["time_generate"], r["time_enqueued"] + r["time_prefill"]))
    out["single_decode_tps"] = max(tps for tps, _ in runs)
    out["single_ttft_s"] = min(ttft for _, ttft in runs)
    out["rss_after_single_mib"] = _peak_rss_mib()

    prompts = cfg["workload"]["jobs"]
    log.info("ours: %d concurrent jobs (prompts %d..%d tokens)", len(prompts), len(prompts[0]), len(prompts[-1]))
    gen = generator([len(p) + new for p in prompts])
    results, wall = drain(gen, [job(p, new) for p in prompts])
    out["aggregate_tps"] = sum(r["new_tokens"] for r in results) / wall
    out["aggregate_wall_s"] = wall
    out["rss_after_aggregate_mib"] = _peak_rss_mib()
    del gen

    turn1 = cfg["workload"]["turn1"]
    log.info("ours: chat turn 1 (%d prompt tokens)", len(turn1))
    # Room for turn 1 (kept cached after it ends) and for turn 2's new pages beside it.
    gen = generator([len(turn1) + ANSWER_TOKENS, len(turn1) + ANSWER_TOKENS + 512])
    stops = sorted(tokenizer.eos_token_ids)
    first = DynamicJob(turn1, ANSWER_TOKENS, gen_settings=SamplerSettings.greedy(), stop_conditions=stops)
    (r1,), _ = drain(gen, [first])
    messages = cfg["workload"]["turn1_messages"] + [
        {"role": "assistant", "content": r1["full_completion"]},
        {"role": "user", "content": FOLLOW_UP},
    ]
    turn2 = _chat_ids(tokenizer, messages)
    out["turn2"] = turn2
    log.info("ours: chat turn 2 (%d prompt tokens), warm then cold", len(turn2))
    (r2,), warm = drain(gen, [job(turn2, 1)])
    out["turn2_warm_ttft_s"] = warm
    out["turn2_cached_tokens"] = r2["cached_tokens"]

    def cold() -> float:
        fresh = generator([len(turn2) + 1])
        return drain(fresh, [job(turn2, 1)])[1]

    out["turn2_cold_ttft_s"] = _best_of(2, cold)

    prompt = turn2[: bench_load.PROMPT_TOKENS]
    out["prompt_tokens"] = len(prompt)
    out["prompt_tps"] = bench_load.prompt_rate(lambda ids: drain(generator([len(ids) + 1]), [job(ids, 1)])[1], prompt)
    out["cpu_wait_share"] = _cpu_wait_share(_SCHED_AT_START)  # before the busy loop below adds its own
    out["threads"] = torch.get_num_threads()  # before the thread policy answers the busy loop
    log.info("ours: single-stream decode with one core busy")
    with bench_load.busy_core():
        drain(generator([16 + WARMUP_TOKENS]), [job(single[:16], WARMUP_TOKENS)])  # the thread policy adapts
        (r,), _ = drain(generator([len(single) + new]), [job(single, new)])
    out["busy_decode_tps"] = (r["new_tokens"] - 1) / r["time_generate"]


# ----------------------------------------------------------------------------------------------- transformers


def _transformers(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers
    from transformers.generation.streamers import BaseStreamer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    out: dict[str, Any] = {"rss_after_import_mib": _peak_rss_mib(), "version": transformers.__version__}
    device, new = cfg["device"], cfg["new_tokens"]
    path = Path(cfg["model"])
    dtype = _torch_dtype(cfg["dtype"])
    t = time.perf_counter()
    if path.is_file():
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model = model.to(device).eval()
    out["load_s"] = time.perf_counter() - t
    out["rss_after_load_mib"] = _peak_rss_mib()
    pad_id = model.generation_config.pad_token_id
    if pad_id is None:
        eos = model.generation_config.eos_token_id
        pad_id = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0

    class Clock(BaseStreamer):
        """Timestamps each put(); the first put is the prompt, each later one a new token."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value) -> None:
            _sync(device)
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
        _sync(device)
        return time.perf_counter() - t0

    single = cfg["workload"]["single"]
    log.info("transformers %s: warm-up and single-stream decode", transformers.__version__)
    generate([single[:16]], WARMUP_TOKENS)
    runs = []
    for _ in range(SINGLE_RUNS):
        clock = Clock()
        t0 = time.perf_counter()
        generate([single], new, clock)
        runs.append(((new - 1) / (clock.times[-1] - clock.times[1]), clock.times[1] - t0))
    out["single_decode_tps"] = max(tps for tps, _ in runs)
    out["single_ttft_s"] = min(ttft for _, ttft in runs)
    out["rss_after_single_mib"] = _peak_rss_mib()

    if cfg["hf_batched"]:
        prompts = cfg["workload"]["jobs"]
        log.info("transformers: padded batch of %d prompts", len(prompts))
        wall = generate(prompts, new)
        out["batched_tps"] = len(prompts) * new / wall
        out["rss_after_batched_mib"] = _peak_rss_mib()

    turn2 = cfg["turn2"]
    log.info("transformers: cold time to first token (%d prompt tokens)", len(turn2))
    out["turn2_cold_ttft_s"] = _best_of(2, lambda: generate([turn2], 1))
    out["peak_rss_mib"] = _peak_rss_mib()
    return out


# ----------------------------------------------------------------------------------------------- llama.cpp


def _llama_cpp(cfg: dict[str, Any]) -> dict[str, Any]:
    """The same GGUF in llama-cpp-python, one sequence (its high-level API has no concurrent jobs), then N
    concurrent jobs through llama.cpp's own llama-batched-bench where it is found (engine/bench/llama_batched.py)."""
    from llama_cpp import Llama

    out: dict[str, Any] = {"rss_after_import_mib": _peak_rss_mib()}
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

    log.info("llama.cpp: chat turn 2, warm (turn 1's prompt in its cache) then cold")
    llm.reset()
    first_token_s(turn1)
    out["turn2_warm_ttft_s"] = first_token_s(turn2)  # generate() reuses the longest cached prefix

    def cold() -> float:
        llm.reset()
        return first_token_s(turn2)

    out["turn2_cold_ttft_s"] = _best_of(2, cold)
    out["prompt_tps"] = bench_load.prompt_rate(
        lambda ids: (llm.reset(), first_token_s(ids))[1], turn2[: bench_load.PROMPT_TOKENS]
    )
    out["peak_rss_mib"] = _peak_rss_mib()
    out["cpu_wait_share"] = _cpu_wait_share(_SCHED_AT_START)  # before the busy loop below adds its own
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


SIDES = {"ours": _ours, "transformers": _transformers, "llama.cpp": _llama_cpp}


def _worker_main(side: str, cfg_path: str, out_path: str) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    import torch

    cfg = json.loads(Path(cfg_path).read_text())
    if cfg["threads"] is not None:
        torch.set_num_threads(cfg["threads"])
    global _SCHED_AT_START
    _SCHED_AT_START = _sched_times()
    result = SIDES[side](cfg)
    result.setdefault("threads", torch.get_num_threads())
    result.setdefault("cpu_wait_share", _cpu_wait_share(_SCHED_AT_START))
    Path(out_path).write_text(json.dumps(result))
    return 0


def _run_side(side: str, cfg: dict[str, Any], tmp: Path) -> dict[str, Any] | None:
    """Run one side in a fresh interpreter; None (after logging why) when it failed."""
    cfg_path, out_path = tmp / f"{side}-cfg.json", tmp / f"{side}-out.json"
    cfg_path.write_text(json.dumps(cfg))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])  # the folder holding the engine package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["TQDM_DISABLE"] = "1"  # transformers' GGUF conversion bar would bury the progress lines
    try:
        stdout: Any = sys.stderr.fileno()  # a worker's chatter belongs with the progress, not the table
    except (AttributeError, OSError, ValueError):
        stdout = subprocess.DEVNULL
    cmd = [sys.executable, "-m", "engine.bench.compare", "--worker", side, str(cfg_path), str(out_path)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=stdout)
    if proc.returncode != 0 or not out_path.exists():
        log.error("the %s run failed (exit code %d); see its messages above", side, proc.returncode)
        return None
    log.info("%s done in %.0f s", side, time.perf_counter() - t)
    return json.loads(out_path.read_text())


def _run_other_sides(
    args: argparse.Namespace,
    path: Path,
    cfg: dict[str, Any],
    sides: dict[str, dict | None],
    notes: list[str],
    tmp: Path,
) -> None:
    """Run transformers and llama.cpp (where installed and wanted) after our side, noting what was skipped."""
    cfg["turn2"] = sides["ours"]["turn2"]
    if args.skip_transformers:
        notes.append("transformers skipped (--skip-transformers).")
    elif importlib.util.find_spec("transformers") is None:
        notes.append("transformers is not installed (pip install transformers); our rows only.")
    else:
        sides["transformers"] = _run_side("transformers", cfg, tmp)
        if sides["transformers"] is None:
            notes.append("the transformers run failed; see the messages above.")
    if path.suffix.lower() != ".gguf":
        notes.append("llama-cpp-python rows skipped: the model is not a .gguf file.")
    elif importlib.util.find_spec("llama_cpp") is None:
        notes.append("llama-cpp-python is not installed; its rows are skipped.")
    else:
        sides["llama.cpp"] = _run_side("llama.cpp", cfg, tmp) or {}
        if not sides["llama.cpp"]:
            notes.append("the llama-cpp-python run failed; see the messages above.")


# ----------------------------------------------------------------------------------------------- the table


def _fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if unit == "ms":
        return f"{value * 1000:,.0f} ms"
    if unit == "MiB":
        return f"{value:,.0f} MiB"
    if unit == "%":
        return f"{value * 100:.0f}%"
    if unit == "s":
        return f"{value:,.1f} s"
    return f"{value:,.1f}"


def _verdict(ok: bool | None, detail: str) -> str:
    return "n/a" if ok is None else f"{'PASS' if ok else 'MISS'} ({detail})"


def build_rows(args: argparse.Namespace, workload: dict, sides: dict[str, dict | None]) -> list[dict[str, str]]:
    """The table: one dict per row with metric, one column per side, target and result."""
    core, features = _groups(args)
    rows = _core_rows(args, workload, sides) if core else []
    if features:
        columns = ["transformers", *(["llama.cpp"] if sides.get("llama.cpp") is not None else [])]
        rows += bench_features.rows(sides.get("ours") or {}, args.new_tokens, _fmt, columns)
    return rows


def _core_rows(args: argparse.Namespace, workload: dict, sides: dict[str, dict | None]) -> list[dict[str, str]]:
    ours = sides.get("ours") or {}
    hf = sides.get("transformers") or {}
    cpp = sides.get("llama.cpp")
    lens = [len(p) for p in workload["jobs"]]
    rows: list[dict[str, str]] = []

    def row(metric: str, key: str, unit: str, target: str = "", result: str = "", hf_key: str | None = None):
        cells = {
            "metric": metric,
            "ours": _fmt(ours.get(key), unit),
            "transformers": _fmt(hf.get(hf_key or key), unit),
        }
        if cpp is not None:
            cells["llama.cpp"] = _fmt(cpp.get(key), unit)
        rows.append({**cells, "target": target, "result": result})

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    x = ratio(ours.get("single_decode_tps"), hf.get("single_decode_tps"))
    row(
        f"single-stream decode tok/s ({len(workload['single'])}-token prompt, {args.new_tokens} new, greedy)",
        "single_decode_tps",
        "tok/s",
        ">= 2x transformers",
        _verdict(None if x is None else x >= 2, f"{x or 0:.2f}x"),
    )
    row("single-stream time to first token", "single_ttft_s", "ms")
    x = ratio(ours.get("aggregate_tps"), hf.get("single_decode_tps"))
    rows.append(
        {
            "metric": f"aggregate tok/s, {args.jobs} concurrent jobs (prompts {min(lens)}-{max(lens)} "
            f"tokens, {args.new_tokens} new each; wall time incl. prefill)",
            "ours": _fmt(ours.get("aggregate_tps"), "tok/s"),
            "transformers": _fmt(hf.get("batched_tps"), "tok/s") + (" (padded batch)" if "batched_tps" in hf else ""),
            **({"llama.cpp": _batched_cell(cpp)} if cpp is not None else {}),
            "target": ">= 8x transformers single-stream",
            "result": _verdict(None if x is None else x >= 8, f"{x or 0:.2f}x"),
        }
    )
    warm, cold = ours.get("turn2_warm_ttft_s"), ours.get("turn2_cold_ttft_s")
    x = ratio(warm, cold)
    cached = ours.get("turn2_cached_tokens")
    row(
        f"second chat turn, time to first token ({len(ours.get('turn2', [])) or '?'}-token prompt; "
        f"{cached if cached is not None else '?'} tokens reused)",
        "turn2_warm_ttft_s",
        "ms",
        "<= 10% of cold",
        _verdict(None if x is None else x <= 0.10, f"{(x or 0) * 100:.1f}%"),
        hf_key="-",
    )
    row("same prompt, cold (fresh cache)", "turn2_cold_ttft_s", "ms")
    prompt_x = ratio(ours.get("prompt_tps"), (cpp or {}).get("prompt_tps"))
    row(
        f"prompt tok/s ({ours.get('prompt_tokens', '?')}-token prompt, cold)",
        "prompt_tps",
        "tok/s",
        ">= 1.0x llama.cpp" if cpp is not None else "",
        _verdict(None if prompt_x is None else prompt_x >= 1.0, f"{prompt_x or 0:.2f}x"),
        hf_key="-",
    )
    if cpp is not None:
        x = ratio(ours.get("single_decode_tps"), cpp.get("single_decode_tps"))
        rows.append(
            {
                "metric": "  single-stream decode against llama.cpp",
                "ours": "",
                "transformers": "",
                "llama.cpp": "",
                "target": ">= 1.0x llama.cpp",
                "result": _verdict(None if x is None else x >= 1.0, f"{x or 0:.2f}x"),
            }
        )
    if cpp is not None:
        x = ratio(ours.get("aggregate_tps"), cpp.get("aggregate_tps"))
        rows.append(
            {
                "metric": f"  {args.jobs} concurrent jobs against llama.cpp",
                "ours": "",
                "transformers": "",
                "llama.cpp": "",
                "target": ">= 1.5x llama.cpp",
                "result": _verdict(None if x is None else x >= 1.5, f"{x or 0:.2f}x"),
            }
        )
    busy, quiet = ours.get("busy_decode_tps"), ours.get("single_decode_tps")
    kept, x = ratio(busy, quiet), ratio(busy, (cpp or {}).get("busy_decode_tps"))
    ok = None if kept is None else kept >= 0.5 and (x is None or x >= 1.5)
    detail = f"{(kept or 0) * 100:.0f}% of quiet" + (f", {x:.2f}x llama.cpp" if x is not None else "")
    row(
        "single-stream decode tok/s, another program keeping one core busy",
        "busy_decode_tps",
        "tok/s",
        ">= 50% of quiet" + (", >= 1.5x llama.cpp" if cpp is not None else ""),
        _verdict(ok, detail),
        hf_key="-",
    )
    row("peak RSS of the whole process", "peak_rss_mib", "MiB")
    row("  of which after imports, before loading", "rss_after_import_mib", "MiB")
    row("  of which after loading the model", "rss_after_load_mib", "MiB")
    row("load time", "load_s", "s")
    row("runnable time spent waiting for a CPU (other load)", "cpu_wait_share", "%")
    return rows


def _batched_cell(cpp: dict) -> str:
    if cpp.get("aggregate_tps") is None:
        return f"n/a (no {bench_batched.TOOL})"
    return f"{_fmt(cpp['aggregate_tps'], 'tok/s')} ({bench_batched.TOOL}, prompts of {cpp['batched_prompt_tokens']})"


def format_table(rows: list[dict[str, str]]) -> str:
    """Rows as a Markdown table (readable in a terminal, pastes into the README)."""
    cols = list(rows[0].keys())
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in cols}
    lines = ["| " + " | ".join(c.ljust(widths[c]) for c in cols) + " |"]
    lines.append("|" + "|".join("-" * (widths[c] + 2) for c in cols) + "|")
    for r in rows:
        lines.append("| " + " | ".join(r.get(c, "").ljust(widths[c]) for c in cols) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by the parsed `bench` options; prints the table. Returns the exit code."""
    _check_args(args)
    from engine.tokenizer import Tokenizer

    path = _model_path(args.model)
    log.info("building prompts with %s's tokenizer", path.name)
    workload = build_workload(Tokenizer.load(path), args)
    cfg = {
        "model": str(path),
        "dtype": args.dtype,
        "device": args.device,
        "new_tokens": args.new_tokens,
        "page_size": args.page_size,
        "threads": args.threads,
        "hf_batched": args.hf_batched,
        "draft_layers": draft_layers(args),
        "workload": workload,
    }
    core, _ = _groups(args)
    notes = []
    sides: dict[str, dict | None] = {}
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        sides["ours"] = _run_side("ours", cfg, Path(tmp))
        if sides["ours"] is None:
            return 1
        if not core:
            notes.append("our engine's feature rows only (--only features).")
        else:
            _run_other_sides(args, path, cfg, sides, notes, Path(tmp))
    hf = sides.get("transformers") or {}
    against = f" vs transformers {hf['version']}" if "version" in hf else ""
    print(
        f"Tandem engine{against} on {path.name}, {args.dtype}, {args.device}, "
        f"{sides['ours'].get('threads')} torch threads ({os.cpu_count()} CPUs)"
    )
    rows = build_rows(args, workload, sides)
    print(format_table(rows))
    if core:
        notes += [
            "Single-stream decode tok/s excludes the prompt: (new tokens - 1) / time from first to last token, "
            f"best of {SINGLE_RUNS} runs.",
            "Aggregate: all jobs' new tokens / wall time from enqueue to the last token (prefill included); "
            "transformers' single-stream rate is the baseline the target is measured against.",
            "Time to first token: wall time of a 1-token generation (best of 2 for cold). Second turn: turn 1 "
            "(history + question, answer up to 64 tokens) ran in the same generator, then the next prompt "
            "(history + answer + follow-up) reuses the cached tokens the engine reports.",
            "Peak RSS: each side runs in its own process; the figure includes Python, torch and (for "
            "transformers) its imports, loading transients, the model, the KV cache and activations.",
        ]
    if "features" in workload:
        notes.append(
            f"Speculation and JSON rows: decode tok/s as above, best of {SINGLE_RUNS} (JSON: of "
            f"{max(SINGLE_RUNS, bench_features.MIN_JSON_RUNS)}), each run in a fresh "
            "generator; acceptance = accepted / (accepted + rejected) drafted tokens. A self-speculation "
            "draft is the model's own first k layers, final norm and head (engine/models/layer_skip.py). "
            "The JSON overhead compares the filtered job with the same prompt decoded unconstrained for the "
            "same number of tokens."
        )
        if bench_features.departed(sides["ours"]):
            notes.append(bench_features.DEPARTS_NOTE)
    waits = {name: side.get("cpu_wait_share", math.nan) for name, side in sides.items() if side}
    busy = {name: w for name, w in waits.items() if w > BUSY_WAIT_SHARE}  # NaN compares False
    if busy:
        shares = ", ".join(f"{name} {w * 100:.0f}%" for name, w in busy.items())
        notes.insert(
            0,
            f"WARNING: other processes competed for the CPU ({shares} of runnable time spent "
            "waiting); these timings are not reliable. Rerun on an idle machine.",
        )
    for note in notes:
        print(f"- {note}")
    if args.json:
        prompts = {"single": len(workload["single"]), "jobs": [len(p) for p in workload["jobs"]]} if core else {}
        if "features" in workload:
            prompts.update({f"{name}_feature": len(ids) for name, ids in workload["features"].items()})
        config = {
            **{k: v for k, v in cfg.items() if k not in ("workload", "turn2")},
            "prompt_tokens": prompts,
        }
        measured = {name: {k: v for k, v in (side or {}).items() if k != "turn2"} for name, side in sides.items()}
        if core:
            measured["ours"]["turn2_prompt_tokens"] = len(sides["ours"]["turn2"])
        Path(args.json).write_text(json.dumps({"config": config, "sides": measured, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(*sys.argv[2:]))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    _parser = argparse.ArgumentParser(prog="python -m engine.bench.compare", description=__doc__)
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
