"""Benchmarks, kept apart from the runtime: nothing in engine/, kernels/ or app/ imports this package.

compare.py        `python -m engine bench`: ours beside transformers and llama.cpp on one model
machine.py        the machine, commit, date and command its --json file records (tools/bench_report.py)
features.py       its feature rows (speculation, constrained output)
load.py           its prompt-rate and busy-core helpers
llama_batched.py  llama.cpp's concurrent-jobs figure from its llama-batched-bench tool
gpu.py            `python -m engine.bench.gpu`: the Triton kernels and a 1B decode on a CUDA GPU
"""
