"""llama.cpp's concurrent-jobs figure for the bench, from its own `llama-batched-bench` tool.

llama-cpp-python's high-level API runs one sequence at a time, so the bench's "N concurrent jobs" row has no
llama.cpp column from it. `llama-batched-bench` (built beside the library by
../shared/tools/build-llama-cpp.sh) decodes N sequences in one batch, as llama-server does: N prompts of one
length, then `new` tokens each. Its wall time for the whole run (prefill included) gives the same figure as
ours, generated tokens / wall time, for prompts of our jobs' mean length (ours are 57-530 tokens; its are
all alike).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

TOOL = "llama-batched-bench"


def find_tool() -> Path | None:
    """The tool beside llama-cpp-python's library (LLAMA_CPP_LIB_PATH), or on PATH."""
    folder = os.environ.get("LLAMA_CPP_LIB_PATH")
    if folder and (Path(folder) / TOOL).is_file():
        return Path(folder) / TOOL
    found = shutil.which(TOOL)
    return Path(found) if found else None


def aggregate_rate(tool: Path, model: str, jobs: int, prompt_tokens: int, new: int, threads: int) -> dict | None:
    """{"aggregate_tps": generated tok/s incl. prefill, "prompt_tokens": ...} for `jobs` sequences, or None when
    the tool fails or prints no result row."""
    context = jobs * (prompt_tokens + new) + 256
    command = [str(tool), "-m", model, "-c", str(context), "-b", "2048", "-ub", "512", "-npp", str(prompt_tokens)]
    command += ["-ntg", str(new), "-npl", str(jobs), "-t", str(threads)]
    env = {**os.environ, "LD_LIBRARY_PATH": str(tool.parent)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse(done.stdout, jobs, new) if done.returncode == 0 else None


def parse(output: str, jobs: int, new: int) -> dict | None:
    """The result row of llama-batched-bench's table: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s
    | T s | S t/s |, for B == jobs."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 10 or not all(re.fullmatch(r"[\d.]+", c) for c in cells):
            continue
        pp, tg, batch, total_s = int(cells[0]), int(cells[1]), int(cells[2]), float(cells[8])
        if batch == jobs and tg == new and total_s > 0:
            return {"aggregate_tps": batch * tg / total_s, "prompt_tokens": pp}
    return None
