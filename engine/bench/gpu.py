"""`python -m engine.bench.gpu`: how fast the Triton kernels and the engine's decode run on this GPU.

    device   copy bandwidth (GB/s, device to device) and bf16 matmul rate (TFLOP/s), measured here
    kernels  per op in bf16: time, achieved GB/s (memory-bound ops) or TFLOP/s (prefill attention) and its
             share of the device figure, beside the torch twin's time on the same inputs
    gguf     the Triton GGUF-block matmul per type, one row (GB/s of blocks read) and 512 rows (TFLOP/s)
    engine   decode tok/s at batch 1/8/32 of a random-weight bf16 Llama of about 1B parameters, and of each
             --gguf file (its weights kept in their blocks), beside the bandwidth-bound ceiling: each step
             reads every weight and the batch's KV once, at copy speed

The engine rows run `model.forward` over the paged cache, greedy argmax feeding the next step (no sampler, no
scheduler): the part of a decode step the kernels decide. It lived in kernels/ as `python -m kernels.bench`,
the one import from kernels into engine; benchmarks now live here, where the runtime never imports them.
Without a CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.bench.gpu_kernels import copy_bandwidth, format_kernel_rows, kernel_rows, matmul_rate, sync

log = logging.getLogger("engine.bench.gpu")  # not __name__: this file runs as __main__

# Llama 3.2 1B's shapes (1.24 B parameters with the tied embedding).
LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class DecodeRow:
    batch_size: int
    context: int  # cached tokens per sequence when the timed steps start
    tokens_per_s: float
    ceiling_tokens_per_s: float  # batch / (bytes read per step / copy bandwidth)


# ----------------------------------------------------------------------------------------------- engine


def decode_ceiling(weight_bytes: int, kv_bytes_per_token: int, batch_size: int, context: int, bandwidth: float):
    """Tokens/s if a decode step did nothing but read all weights and the batch's KV once at `bandwidth`."""
    step_bytes = weight_bytes + batch_size * context * kv_bytes_per_token
    return batch_size * bandwidth / step_bytes


def random_model(device: torch.device, dtype: torch.dtype, config: dict | None = None):
    """A random-weight Llama (`config`, Llama 3.2 1B's shapes by default) in `dtype` on `device`."""
    from engine.config.model import ModelConfig
    from engine.models.llama import LlamaForCausalLM

    model_config = ModelConfig.from_hf_dict(config or LLAMA_1B)
    with torch.device(device):
        model = LlamaForCausalLM(model_config).to(dtype)
    if model_config.tie_word_embeddings:
        model.tie_weights()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:  # norms keep their ones; projections start as torch.empty
                p.normal_(0.0, 0.02)
    return model.eval()


def weight_bytes(model) -> int:
    """Bytes of the model's parameters and buffers (GGUF blocks), each storage counted once (a tied head)."""
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def engine_decode(
    model,
    device: torch.device,
    batch_sizes: Sequence[int],
    bandwidth: float,
    context: int = 512,
    steps: int = 32,
    page_size: int = 256,
) -> list[DecodeRow]:
    """Decode tok/s of `model` per batch size.

    Each batch prefills `context` random tokens per sequence, runs two untimed steps, then times `steps`.
    """
    from engine.cache import Cache

    model_config = model.config
    layers, kv_heads = model_config.num_hidden_layers, model_config.num_key_value_heads
    kv_bytes_per_token = 2 * layers * kv_heads * model_config.head_dim * model.dtype.itemsize
    model_bytes = weight_bytes(model)

    rows = []
    pages_per_seq = -(-(context + steps + 2) // page_size)
    for batch_size in batch_sizes:
        cache = Cache(model, max_seq_len=batch_size * pages_per_seq * page_size, page_size=page_size)
        tables = [list(range(i * pages_per_seq, (i + 1) * pages_per_seq)) for i in range(batch_size)]
        rate = _decode_rate(model, cache, tables, context, steps, device)
        ceiling = decode_ceiling(model_bytes, kv_bytes_per_token, batch_size, context + 2 + steps // 2, bandwidth)
        rows.append(DecodeRow(batch_size, context + 2, rate, ceiling))
        del cache  # the next batch size allocates its own
        log.info("engine decode b=%d done", batch_size)
    return rows


def _decode_rate(model, cache, tables: list[list[int]], context: int, steps: int, device: torch.device) -> float:
    """Prefill `context` random tokens per sequence, two untimed decode steps, then tok/s over `steps`."""
    from engine.models import Batch

    batch_size = len(tables)

    def step(past: int, query_len: int, ids: torch.Tensor) -> torch.Tensor:
        batch = Batch.build(cache, tables, [past] * batch_size, [query_len] * batch_size)
        return model(ids, batch.positions(), batch).argmax(-1)  # greedy, stays on the device

    with torch.inference_mode():
        ids = torch.randint(0, model.config.vocab_size, (batch_size * context,), device=device)
        ids = step(0, context, ids)
        ids = step(context, 1, ids)
        ids = step(context + 1, 1, ids)
        sync(device)
        t0 = time.perf_counter()
        for i in range(steps):
            ids = step(context + 2 + i, 1, ids)
        sync(device)
        return batch_size * steps / (time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------- report


def format_decode_rows(rows: Sequence[DecodeRow]) -> str:
    lines = [f"{'batch':>5} {'context':>8} {'tok/s':>10} {'ceiling tok/s':>14} {'of ceiling':>10}"]
    for r in rows:
        lines.append(
            f"{r.batch_size:>5} {r.context:>8} {r.tokens_per_s:>10.1f} {r.ceiling_tokens_per_s:>14.1f} "
            f"{r.tokens_per_s / r.ceiling_tokens_per_s:>10.0%}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench.gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", default="1,8,32", help="engine decode batch sizes (comma-separated)")
    parser.add_argument("--context", type=int, default=512, help="cached tokens per sequence when decode starts")
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per batch size")
    parser.add_argument(
        "--gguf", metavar="PATH", action="append", default=[], help="also decode this GGUF file (repeatable)"
    )
    parser.add_argument("--skip-kernels", action="store_true", help="engine rows only")
    parser.add_argument("--skip-engine", action="store_true", help="kernel rows only")
    parser.add_argument(
        "--reference", action="store_true", help="run the engine on the torch twins (TANDEM_FORCE_REFERENCE=1)"
    )
    args = parser.parse_args(argv)
    try:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        parser.error(f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}")
    if min(batch_sizes) < 1 or args.context < 1 or args.steps < 1:
        parser.error("batch sizes, --context and --steps must be positive")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    if not torch.cuda.is_available():
        print("No CUDA GPU is available (torch.cuda.is_available() is False), so nothing was measured:")
        print("engine.bench.gpu times the Triton kernels on a GPU. On CPU the engine runs the torch twins.")
        return 0
    from kernels.triton import candidates as triton_kernels

    if not triton_kernels.is_available():
        print("triton is not installed, so the Triton kernels cannot run: pip install 'triton==3.9.0'")
        return 1
    if args.reference:
        os.environ["TANDEM_FORCE_REFERENCE"] = "1"  # read by dispatch on its first call, which comes later

    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    bandwidth, flops = copy_bandwidth(device), matmul_rate(device)
    print(f"device: {name}; copy {bandwidth / 1e9:.0f} GB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s (measured)")
    if not args.skip_kernels:
        print()
        print(format_kernel_rows(kernel_rows(device), bandwidth, flops))
    if not args.skip_engine:
        backend = "torch twins" if args.reference else "Triton kernels where they apply"
        models = [("random-weight bf16 Llama 3.2 1B shapes", lambda: random_model(device, torch.bfloat16))]
        models += [(path, lambda path=path: _load(path, device)) for path in args.gguf]
        for label, make in models:
            model = make()
            rows = engine_decode(model, device, batch_sizes, bandwidth, args.context, args.steps)
            print()
            print(f"engine decode, {label} ({weight_bytes(model) / 2**20:.0f} MiB of weights), {backend}:")
            print(format_decode_rows(rows))
            del model
            torch.cuda.empty_cache()
    return 0


def _load(path: str, device: torch.device):
    from engine.models import Model

    return Model.load(path, device=device, dtype=torch.bfloat16)


if __name__ == "__main__":
    sys.exit(main())
