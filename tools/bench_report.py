"""Write docs/benchmarks.md from the JSON files of `python -m engine bench ... --json FILE`.

    python tools/bench_report.py [FILE.json ...] [--out docs/benchmarks.md]

One section per machine class (CPU model and numbers, the kernel-relevant CPU flags, logical CPUs, GPU), and
in it the newest run of each bench command: its date, commit and command, then the bench's own table with
llama.cpp's column beside ours. The page is generated so that its figures are always the bench's, never
retyped; with no file it says how the figures are made and leaves their place marked. Development tool:
nothing in the app or engine imports it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "docs" / "benchmarks.md"
# llama.cpp beside ours; then the rest as the bench printed them.
COLUMN_ORDER = ("metric", "ours", "llama.cpp", "transformers", "target", "result")
BUSY_WAIT_SHARE = 0.10  # engine/bench/measure.py's threshold: above it the bench calls its timings unreliable
NO_FIGURES = "<!-- bench figures: none yet; run the commands above and this script -->"
EMPTY = "**No figures yet**: run the bench on a machine where llama.cpp is built, then this script."

PREAMBLE = """\
# Benchmarks

This page is written by `tools/bench_report.py` from the JSON files of `python -m engine bench ... --json FILE`;
edit the script, not the page. Keep the JSON files in `docs/bench-results/` so the page can be written again
when a machine is added:

```
python tools/bench_report.py docs/bench-results/*.json --out docs/benchmarks.md
```

## How the figures are made

- `python -m engine bench MODEL --json FILE` runs our engine, transformers' `generate()` and llama.cpp on the
  same file, dtype and prompts, each side in its own process, so each peak RSS is its own. `--only core` keeps
  the comparison rows, `--skip-transformers` leaves transformers out, `--jobs N` sets the concurrent-jobs row.
  The JSON records the machine, the commit (and whether the tree had local changes), the date and the command.
- llama.cpp's side is llama-cpp-python 0.3.36, built for the machine's CPU by
  `../shared/tools/build-llama-cpp.sh`; its concurrent-jobs figure is its own `llama-batched-bench` with as many
  sequences as our jobs, each of our jobs' mean prompt length. Both sides run `--threads` threads (default: all
  the CPUs torch uses).
- The 1B files are random weights in Llama-3.2-1B's shape with the starter's tokenizer:
  `python tools/make_bench_model.py OUT_DIR` writes Q4_K_M, Q4_0 and Q8_0. The starter is SmolLM2-135M-Instruct
  (Q4_1), `python -m engine bench --only core`. The mixture-of-experts files keep a few layers of the real shapes:
  `python tools/make_bench_model.py OUT_DIR --shape qwen3moe` (Qwen3-30B-A3B: 128 experts, top 8, Q4_K_M) and
  `--shape gpt-oss --types MXFP4` (gpt-oss-20b: 32 experts, top 4), random routers included. Their "decode
  bound" row divides the bytes one decode step must read (dense weights and the head whole, experts at top_k /
  num_experts) into the rate the bench's threads stream memory.
- Decode tok/s excludes the prompt (new tokens - 1 over the time from the first to the last token, best of
  two runs); concurrent jobs count every job's new tokens over the wall time, prefill included; "one core busy"
  runs a busy loop beside the decode. A run where a side waited for a CPU more than 10% of its runnable time is
  marked: its timings are not reliable. Runs of the same command on one machine move by 10-20%, so compare
  ratios within a run.
"""


class ReportError(ValueError):
    """A bench file cannot be used; the message names the file and what to do."""


def read_bench(path: Path) -> dict[str, Any]:
    """One bench JSON file, checked for the blocks the page needs."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReportError(
            f"{path}: not a bench JSON file ({e}); write one with `python -m engine bench ... --json FILE`"
        ) from e
    if not isinstance(data, dict):
        raise ReportError(f"{path}: not a bench JSON file (no object at the top); write one with the bench's --json")
    missing = [key for key in ("run", "machine", "config", "rows") if key not in data]
    if missing:
        raise ReportError(
            f"{path}: has no {', '.join(missing)} block: it was written by an older bench; run "
            f"`python -m engine bench ... --json {path}` again with this checkout"
        )
    return data


def machine_key(machine: dict[str, Any]) -> tuple:
    return (machine["cpu"], machine.get("cpu_family_model"), tuple(machine["flags"]), machine["cpus"], machine["gpu"])


def machine_title(machine: dict[str, Any]) -> str:
    numbers = f" ({machine['cpu_family_model']})" if machine.get("cpu_family_model") else ""
    gpu = f", {machine['gpu']}" if machine.get("gpu") else ""
    return f"{machine['cpu']}{numbers}, {machine['cpus']} CPUs{gpu}"


def command_key(command: str) -> str:
    """The command without its --json PATH: two runs differing only in where they wrote are the same run."""
    parts = shlex.split(command)
    if "--json" in parts:
        at = parts.index("--json")
        del parts[at : at + 2]
    return shlex.join(parts)


def newest_runs(files: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Machine key -> its newest run of each command, ordered by model file name, then command."""
    newest: dict[tuple, dict[str, dict[str, Any]]] = {}
    for data in files:
        runs = newest.setdefault(machine_key(data["machine"]), {})
        key = command_key(data["run"]["command"])
        if key not in runs or data["run"]["date"] > runs[key]["run"]["date"]:
            runs[key] = data
    return {
        machine: sorted(runs.values(), key=lambda d: (Path(d["config"]["model"]).name, d["run"]["command"]))
        for machine, runs in newest.items()
    }


def _table(rows: list[dict[str, str]]) -> list[str]:
    present = [c for c in COLUMN_ORDER if any(c in r for r in rows)]
    present += [c for c in rows[0] if c not in present]
    # a side with no figure in any row (transformers skipped) is left out rather than shown as a column of n/a
    shown = [c for c in present if c == "metric" or any(r.get(c, "") not in ("", "n/a") for r in rows)]
    lines = ["| " + " | ".join(shown) + " |", "|" + "|".join("---" for _ in shown) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(r.get(c, "").strip().replace("|", "\\|") for c in shown) + " |")
    return lines


def _versions(data: dict[str, Any]) -> str:
    software = data.get("software") or {}
    parts = [f"torch {software['torch']}"] if software.get("torch") else []
    if "llama.cpp" in data.get("sides", {}) and software.get("llama_cpp_python"):
        parts.append(f"llama-cpp-python {software['llama_cpp_python']}")
    hf = (data.get("sides") or {}).get("transformers") or {}
    if hf.get("version"):
        parts.append(f"transformers {hf['version']}")
    return ", ".join(parts)


def run_section(data: dict[str, Any]) -> list[str]:
    run, config = data["run"], data["config"]
    commit = (run.get("commit") or "unknown")[:12] + (" with local changes" if run.get("local_changes") else "")
    threads = (data.get("sides", {}).get("ours") or {}).get("threads")
    details = [f"{run['date']}", f"commit {commit}"]
    if threads:
        details.append(f"{threads} torch thread{'s' * (threads != 1)}")
    if _versions(data):
        details.append(_versions(data))
    lines = [
        f"### {Path(config['model']).name}, {config['dtype']}, {config['device']}",
        "",
        f"`{run['command']}`",
        "",
        "; ".join(details) + ".",
        "",
    ]
    waits = {name: (side or {}).get("cpu_wait_share") for name, side in data.get("sides", {}).items()}
    busy = [f"{name} {w * 100:.0f}%" for name, w in waits.items() if isinstance(w, float) and w > BUSY_WAIT_SHARE]
    if busy:
        lines += [f"**Not reliable**: other programs competed for the CPU ({', '.join(busy)} waiting).", ""]
    return lines + _table(data["rows"]) + [""]


def render(files: list[dict[str, Any]]) -> str:
    """The whole page for these bench files (none: the preamble and the marked place for figures)."""
    lines = [PREAMBLE]
    by_machine = newest_runs(files)
    if not by_machine:
        lines += ["## Figures", "", NO_FIGURES, "", EMPTY]
    for runs in sorted(by_machine.values(), key=lambda runs: machine_title(runs[0]["machine"])):
        machine = runs[0]["machine"]
        flags = " ".join(machine["flags"]) or "none of those the kernels choose by"
        lines += [f"## {machine_title(machine)}", "", f"CPU flags: {flags}. {machine['system']}.", ""]
        for data in runs:
            lines += run_section(data)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="JSON files written by `python -m engine bench --json`")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the page to write (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    try:
        files = [read_bench(path) for path in args.files]
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.write_text(render(files), encoding="utf-8")
    print(f"wrote {args.out} ({len(files)} bench files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
