"""`python -m engine.bench.worker SIDE CFG OUT`: one side of the bench in its own process (compare.py starts
it), so its peak memory is its own and no side warms another's caches. Not imported by the package, so
running it as __main__ does not load it twice."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from engine.bench import measure, side_llama_cpp, side_ours, side_transformers

SIDES = {"ours": side_ours.run, "transformers": side_transformers.run, "llama.cpp": side_llama_cpp.run}


def main(side: str, cfg_path: str, out_path: str) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    import torch

    cfg = json.loads(Path(cfg_path).read_text())
    if cfg["threads"] is not None:
        torch.set_num_threads(cfg["threads"])
    measure.mark_start()
    result = SIDES[side](cfg)
    result.setdefault("threads", torch.get_num_threads())
    result.setdefault("cpu_wait_share", measure.cpu_wait_share())
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
