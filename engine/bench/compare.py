"""`python -m engine bench`: our engine vs transformers' `generate()` on the same model, dtype and prompts.

    parent: build the prompts once (token ids) -> run each side in its own subprocess, one after another
            -> print one table (stdout), progress on stderr, optionally --json (the figures with their
               machine, commit, date and command: engine/bench/machine.py; tools/bench_report.py reads it)
    worker: load the model, run the phases, write its measurements (and its own peak RSS) to a JSON file

Each side runs in its own process so that its peak RSS is its own and neither warms the other's caches.
Phases: single-stream decode, 16 concurrent jobs, a second chat turn over a long shared history vs cold
("core"); then, on our engine only, speculative decoding and constrained JSON output ("features", see
engine/bench/features.py). `--only core` or `--only features` runs one group; `--only kv` runs the KV cache
formats' rows (engine/bench/kv_formats.py) in this process, apart from the others.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.bench import features as bench_features
from engine.bench import machine as bench_machine
from engine.bench import measure, table
from engine.bench import workload as prompts_of

log = logging.getLogger("engine.bench")

DTYPES = ("bfloat16", "float16", "float32")
GROUPS = ("all", "core", "features", "kv")
DEFAULT_DRAFT_LAYERS = "8,16"


# ----------------------------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `bench` options to `parser` (the `python -m engine bench` subcommand)."""
    parser.add_argument(
        "model", nargs="?", default="starter", help="a model folder, a .gguf file, 'starter' (the default) or 'demo'"
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
        "(no transformers or llama.cpp run); all: both (the default); kv: the KV cache formats' bytes, "
        "quality and speed (with llama.cpp's q8_0/q4_0 quality where llama-perplexity is found)",
    )
    parser.add_argument("--kv-context", type=int, default=8000, help="kv rows: the long prompt's tokens")
    parser.add_argument("--kv-new-tokens", type=int, default=32, help="kv rows: new tokens after the long prompt")
    parser.add_argument("--kv-text-tokens", type=int, default=2048, help="kv rows: tokens of text the KL reads")
    parser.add_argument("--kv-window", type=int, default=512, help="kv rows: llama-perplexity's window")
    parser.add_argument(
        "--kv-disk-tokens",
        type=int,
        default=2100,
        help="kv rows: the prompt read back from the disk tier (its tokens past the last full page are computed "
        "again: 2,048 with pages of 256 is the worst case, 255 of them)",
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
    numbers = ("new_tokens", "jobs", "max_prompt_tokens", "history_tokens", "page_size")
    for name in (*numbers, "kv_context", "kv_text_tokens", "kv_window", "kv_disk_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.kv_new_tokens < 2:
        raise ValueError("--kv-new-tokens must be >= 2: the decode rate is measured after the first token")
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


def _model_path(spec: str) -> Path:
    from engine.errors import MissingFileError
    from engine.loading.builtin import resolve_model

    try:
        return resolve_model(spec)  # a path, 'starter' or 'demo', as every command takes
    except MissingFileError as e:  # the bench refuses its arguments with ValueError, before any side runs
        raise ValueError(str(e)) from None


# The folder holding the engine package. Not engine/ itself: there engine/gguf would shadow the gguf package.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def _run_side(side: str, cfg: dict[str, Any], tmp: Path) -> dict[str, Any] | None:
    """Run one side in a fresh interpreter; None (after logging why) when it failed."""
    cfg_path, out_path = tmp / f"{side}-cfg.json", tmp / f"{side}-out.json"
    cfg_path.write_text(json.dumps(cfg))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    env["TQDM_DISABLE"] = "1"  # transformers' GGUF conversion bar would bury the progress lines
    try:
        stdout: Any = sys.stderr.fileno()  # a worker's chatter belongs with the progress, not the table
    except (AttributeError, OSError, ValueError):
        stdout = subprocess.DEVNULL
    cmd = [sys.executable, "-m", "engine.bench.worker", side, str(cfg_path), str(out_path)]
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


def _run_kv(args: argparse.Namespace, path: Path) -> int:
    """The KV cache formats' rows, in this process (they compare caches of one model, not processes)."""
    import torch

    from engine.bench import kv_formats, kv_windows
    from engine.models import Model

    if args.threads:
        torch.set_num_threads(args.threads)
    model = Model.load(path, device=args.device, dtype=measure.torch_dtype(args.dtype))
    measured = kv_formats.measure(model, path, args)
    measured["windows"] = kv_windows.measure(args.page_size)
    rows = kv_formats.rows(measured, table.fmt) + kv_windows.rows(measured["windows"])
    print(f"KV cache formats on {path.name}, {args.dtype}, {args.device}, {torch.get_num_threads()} torch threads")
    print(table.format_table(rows))
    print(f"- {kv_formats.NOTE}")
    print(f"- {kv_windows.NOTE}")
    if args.json:
        report = {
            "run": bench_machine.describe_run(args, add_arguments),
            "machine": bench_machine.describe_machine(args.device),
            "software": bench_machine.software(),
            "config": {"model": str(path), "dtype": args.dtype, "device": args.device, "page_size": args.page_size},
            "sides": {"ours": measured},
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by the parsed `bench` options; prints the table. Returns the exit code."""
    _check_args(args)
    from engine.tokenizer.tokenizer import Tokenizer

    path = _model_path(args.model)
    if args.only == "kv":
        return _run_kv(args, path)
    log.info("building prompts with %s's tokenizer", path.name)
    workload = prompts_of.build_workload(Tokenizer.load(path), args)
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
    core, _ = prompts_of.groups(args)
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
    rows = table.build_rows(args, workload, sides)
    print(table.format_table(rows))
    if core:
        notes += [
            "Single-stream decode tok/s excludes the prompt: (new tokens - 1) / time from first to last token, "
            f"best of {measure.SINGLE_RUNS} runs.",
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
            f"Speculation and JSON rows: decode tok/s as above, best of {measure.SINGLE_RUNS} (JSON: of "
            f"{max(measure.SINGLE_RUNS, bench_features.MIN_JSON_RUNS)}), each run in a fresh "
            "generator; acceptance = accepted / (accepted + rejected) drafted tokens. A self-speculation "
            "draft is the model's own first k layers, final norm and head (engine/models/layer_skip.py). "
            "The JSON overhead compares the filtered job with the same prompt decoded unconstrained for the "
            "same number of tokens."
        )
        if bench_features.departed(sides["ours"]):
            notes.append(bench_features.DEPARTS_NOTE)
    waits = {name: side.get("cpu_wait_share", math.nan) for name, side in sides.items() if side}
    busy = {name: w for name, w in waits.items() if w > measure.BUSY_WAIT_SHARE}  # NaN compares False
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
        report = {
            "run": bench_machine.describe_run(args, add_arguments),
            "machine": bench_machine.describe_machine(args.device),
            "software": bench_machine.software(),
            "config": config,
            "sides": measured,
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0
