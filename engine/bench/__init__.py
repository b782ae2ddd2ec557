"""Benchmarks, kept apart from the runtime: nothing in engine/, kernels/ or app/ imports this package.

compare.py        `python -m engine bench`: ours beside transformers and llama.cpp on one model
features.py       its feature rows (speculation, constrained output)
load.py           its prompt-rate and busy-core helpers
llama_batched.py  llama.cpp's concurrent-jobs figure from its llama-batched-bench tool
gpu.py            `python -m engine.bench.gpu`: the Triton kernels and a 1B decode on a CUDA GPU
"""

from engine.bench.compare import add_arguments, run
from engine.bench.table import build_rows
from engine.bench.workload import build_workload

__all__ = ["add_arguments", "build_rows", "build_workload", "run"]
