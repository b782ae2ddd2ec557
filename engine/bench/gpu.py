"""`python -m engine.bench.gpu`: how fast the Triton kernels and the engine's decode run on this GPU.

    device   copy bandwidth (GB/s, device to device) and bf16 matmul rate (TFLOP/s), measured here
    kernels  per op in bf16: time, achieved GB/s (memory-bound ops) or TFLOP/s (prefill attention) and its
             share of the device figure, beside the torch twin's time on the same inputs
    engine   decode tok/s at batch 1/8/32 of a random-weight bf16 Llama of about 1B parameters, beside the
             bandwidth-bound ceiling: each step reads every weight and the batch's KV once, at copy speed

The engine rows run `model.forward` over the paged cache, greedy argmax feeding the next step (no sampler, no
scheduler): the part of a decode step the kernels decide. It lived in kernels/ as `python -m kernels.bench`,
the one import from kernels into engine; benchmarks now live here, where the runtime never imports them.
Without a CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

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
class KernelRow:
    name: str
    ms: float  # Triton kernel, median
    ref_ms: float  # torch twin, median
    amount: float  # bytes moved, or FLOPs for compute-bound rows
    unit: str  # "GB/s" or "TFLOP/s"


@dataclass(frozen=True)
class DecodeRow:
    batch_size: int
    context: int  # cached tokens per sequence when the timed steps start
    tokens_per_s: float
    ceiling_tokens_per_s: float  # batch / (bytes read per step / copy bandwidth)


# ----------------------------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int = 3, iters: int = 20) -> float:
    """Median wall time of fn() in milliseconds, each call synchronized (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, num_bytes: int = 1 << 30) -> float:
    """Device-to-device copy rate in bytes/s, counting the read and the write."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, iters=10)
    return 2 * num_bytes / (ms * 1e-3)


def matmul_rate(device: torch.device, n: int = 8192) -> float:
    """bf16 n x n x n matmul rate in FLOP/s."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = time_ms(lambda: a @ b, device, iters=10)
    return 2 * n**3 / (ms * 1e-3)


# ----------------------------------------------------------------------------------------------- kernels


def _paged_inputs(seq_lens: Sequence[int], query_lens: Sequence[int], device, page_size=256, hq=32, hkv=8, d=128):
    """Random q and cache with each sequence's pages scattered over the cache, as after some churn."""
    dtype = torch.bfloat16
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    order = torch.randperm(sum(pages_per_seq)).tolist()
    tables, used = [], 0
    for n in pages_per_seq:
        tables.append(order[used : used + n])
        used += n
    width = max(pages_per_seq)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], device=device)
    k_cache = torch.randn(used, page_size, hkv, d, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(sum(query_lens), hq, d, device=device, dtype=dtype)
    seq_lens_t = torch.tensor(list(seq_lens), device=device)
    args = (q, k_cache, v_cache, block_tables, seq_lens_t, tuple(query_lens), tuple(seq_lens), d**-0.5)
    return args


def kernel_rows(device: torch.device) -> list[KernelRow]:
    """Time each Triton kernel and its twin on model-sized bf16 inputs."""
    from kernels.torch_ref import activation, attention, norm, rope
    from kernels.triton import activation as t_activation
    from kernels.triton import attention as t_attention
    from kernels.triton import kv_write as t_kv_write
    from kernels.triton import norm as t_norm
    from kernels.triton import rope as t_rope

    bf16, rows = torch.bfloat16, []

    def add(name, triton_fn, ref_fn, amount, unit="GB/s"):
        rows.append(KernelRow(name, time_ms(triton_fn, device), time_ms(ref_fn, device), amount, unit))
        log.info("%s done", name)

    tokens, hidden = 8192, 4096
    x = torch.randn(tokens, hidden, device=device, dtype=bf16)
    res = torch.randn_like(x)
    w = torch.randn(hidden, device=device, dtype=bf16)
    add(
        f"rms_norm + residual [{tokens}, {hidden}]",
        lambda: t_norm.rms_norm(x, w, 1e-6, res),
        lambda: norm.rms_norm(x, w, 1e-6, res),
        4 * x.numel() * 2 + hidden * 2,  # x, residual in; out, new residual out
    )

    heads, head_dim = 32, 128
    q = torch.randn(tokens, heads, head_dim, device=device, dtype=bf16)
    cos = torch.randn(tokens, head_dim, device=device, dtype=bf16)
    sin = torch.randn_like(cos)
    add(
        f"rope [{tokens}, {heads}, {head_dim}]",
        lambda: t_rope.apply_rope(q, cos, sin),
        lambda: rope.apply_rope(q, cos, sin),
        2 * q.numel() * 2 + 2 * cos.numel() * 2,
    )

    inter = 14336
    gate_up = torch.randn(tokens, 2 * inter, device=device, dtype=bf16)
    add(
        f"silu_and_mul [{tokens}, 2 x {inter}]",
        lambda: t_activation.silu_and_mul(gate_up),
        lambda: activation.silu_and_mul(gate_up),
        3 * tokens * inter * 2,
    )

    page_size, kv_heads = 256, 8
    k_cache = torch.zeros(2 * tokens // page_size, page_size, kv_heads, head_dim, device=device, dtype=bf16)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=bf16)
    v = torch.randn_like(k)
    slots = torch.randperm(k_cache.shape[0] * page_size, device=device)[:tokens]
    add(
        f"write_kv [{tokens}, {kv_heads}, {head_dim}]",
        lambda: t_kv_write.write_kv(k_cache, v_cache, k, v, slots),
        lambda: attention.write_kv(k_cache, v_cache, k, v, slots),
        4 * k.numel() * 2 + slots.numel() * 8,
    )

    context = 4096
    for batch in (1, 8, 32):
        args = _paged_inputs([context] * batch, [1] * batch, device)
        kv_bytes = 2 * batch * context * kv_heads * head_dim * 2
        add(
            f"decode attention b={batch} ctx={context}",
            lambda args=args: t_attention.paged_attention(*args),
            lambda args=args: attention.paged_attention(*args),
            kv_bytes,
        )

    for label, past, new, num_seqs in (("prefill", 0, 2048, 4), ("chunked prefill", 3584, 512, 1)):
        args = _paged_inputs([past + new] * num_seqs, [new] * num_seqs, device)
        keys_attended = num_seqs * sum(past + i + 1 for i in range(new))
        add(
            f"{label} attention {num_seqs} x {new} new, {past} cached",
            lambda args=args: t_attention.paged_attention(*args),
            lambda args=args: attention.paged_attention(*args),
            4 * heads * head_dim * keys_attended,  # QK^T and PV, 2 FLOPs per multiply-add each
            "TFLOP/s",
        )
    return rows


# ----------------------------------------------------------------------------------------------- engine


def decode_ceiling(weight_bytes: int, kv_bytes_per_token: int, batch_size: int, context: int, bandwidth: float):
    """Tokens/s if a decode step did nothing but read all weights and the batch's KV once at `bandwidth`."""
    step_bytes = weight_bytes + batch_size * context * kv_bytes_per_token
    return batch_size * bandwidth / step_bytes


def engine_decode(
    device: torch.device,
    dtype: torch.dtype,
    batch_sizes: Sequence[int],
    bandwidth: float,
    context: int = 512,
    steps: int = 32,
    config: dict | None = None,
    page_size: int = 256,
) -> list[DecodeRow]:
    """Decode tok/s of a random-weight Llama (`config`, Llama 3.2 1B's shapes by default) per batch size.

    Each batch prefills `context` random tokens per sequence, runs two untimed steps, then times `steps`.
    """
    from engine.cache import Cache
    from engine.config import ModelConfig
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
    model.eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: counted once
    layers, kv_heads = model_config.num_hidden_layers, model_config.num_key_value_heads
    kv_bytes_per_token = 2 * layers * kv_heads * model_config.head_dim * model.dtype.itemsize

    rows = []
    pages_per_seq = -(-(context + steps + 2) // page_size)
    for batch_size in batch_sizes:
        cache = Cache(model, max_seq_len=batch_size * pages_per_seq * page_size, page_size=page_size)
        tables = [list(range(i * pages_per_seq, (i + 1) * pages_per_seq)) for i in range(batch_size)]
        rate = _decode_rate(model, cache, tables, context, steps, device)
        ceiling = decode_ceiling(weight_bytes, kv_bytes_per_token, batch_size, context + 2 + steps // 2, bandwidth)
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
        _sync(device)
        t0 = time.perf_counter()
        for i in range(steps):
            ids = step(context + 2 + i, 1, ids)
        _sync(device)
        return batch_size * steps / (time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------- report


def format_kernel_rows(rows: Sequence[KernelRow], bandwidth: float, flops: float) -> str:
    lines = [f"{'kernel':<48} {'triton ms':>10} {'rate':>16} {'of device':>9} {'twin ms':>9} {'speedup':>8}"]
    for r in rows:
        rate = r.amount / (r.ms * 1e-3)
        peak = bandwidth if r.unit == "GB/s" else flops
        scale = 1e9 if r.unit == "GB/s" else 1e12
        lines.append(
            f"{r.name:<48} {r.ms:>10.3f} {rate / scale:>8.1f} {r.unit:<7} {rate / peak:>8.0%} "
            f"{r.ref_ms:>9.3f} {r.ref_ms / r.ms:>7.1f}x"
        )
    return "\n".join(lines)


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
    from kernels import triton as triton_kernels

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
        rows = engine_decode(device, torch.bfloat16, batch_sizes, bandwidth, args.context, args.steps)
        backend = "torch twins" if args.reference else "Triton kernels where they apply"
        print()
        print(f"engine decode, random-weight bf16 Llama 3.2 1B shapes, {backend}:")
        print(format_decode_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
