"""`python -m engine.bench.gpu`: its no-GPU exit, and the engine decode measurement run small on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.bench import gpu as bench
from engine.bench import gpu_kernels

ROOT = Path(__file__).resolve().parents[3]
TINY_LLAMA = dict(
    bench.LLAMA_1B,
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed when there is no GPU")
def test_without_a_gpu_it_says_so_and_exits_0():
    module = "engine.bench.gpu"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "No CUDA GPU is available" in run.stdout


def test_bad_batch_sizes_are_rejected_by_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--batch-sizes", "1,x"])
    assert exit_info.value.code == 2
    assert "--batch-sizes" in capsys.readouterr().err


def test_decode_ceiling_is_bandwidth_over_bytes_per_step():
    # 2 sequences of 1000 tokens, 1 kB of KV per token, 1 GB of weights, 1 TB/s.
    ceiling = bench.decode_ceiling(10**9, 1000, 2, 1000, 1e12)
    assert ceiling == pytest.approx(2 * 1e12 / (10**9 + 2 * 1000 * 1000))


def test_engine_decode_runs_on_a_tiny_model():
    """The GPU measurement's code path, small and on the CPU (through the torch twins)."""
    cpu = torch.device("cpu")
    model = bench.random_model(cpu, torch.float32, TINY_LLAMA)
    rows = bench.engine_decode(model, cpu, (1, 3), bandwidth=1e10, context=20, steps=3, page_size=16)
    assert [r.batch_size for r in rows] == [1, 3]
    assert all(r.context == 22 and r.tokens_per_s > 0 and r.ceiling_tokens_per_s > 0 for r in rows)
    table = bench.format_decode_rows(rows)
    assert "ceiling tok/s" in table and len(table.splitlines()) == 3


def test_kernel_table_reports_rates_against_the_device():
    rows = [
        gpu_kernels.KernelRow("norm", 1.0, 3.0, 1e9, "GB/s"),
        gpu_kernels.KernelRow("prefill", 2.0, 4.0, 1e12, "TFLOP/s"),
    ]
    table = gpu_kernels.format_kernel_rows(rows, bandwidth=2e12, flops=1e15).splitlines()
    assert "1000.0 GB/s" in table[1] and "50%" in table[1] and "3.0x" in table[1]
    assert "500.0 TFLOP/s" in table[2] and "50%" in table[2] and "2.0x" in table[2]


def test_gguf_rows_time_the_triton_matmul_and_its_twin():
    """The GGUF rows' code path, small and on the CPU (the Triton kernel in triton's interpreter)."""
    pytest.importorskip("triton")
    rows = gpu_kernels.gguf_kernel_rows(torch.device("cpu"), types=("Q4_K",), shape=(32, 256))
    assert [r.unit for r in rows] == ["GB/s", "TFLOP/s"]
    assert rows[0].amount == 32 * 144  # a decode row is judged by the blocks it reads
    assert rows[1].amount == 2 * 512 * 32 * 256
    assert all(r.ms > 0 and r.ref_ms > 0 for r in rows)
