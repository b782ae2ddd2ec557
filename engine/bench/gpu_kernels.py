"""The GPU kernel measurements of `python -m engine.bench.gpu`: the device's copy and matmul rates, and each
Triton kernel (the GGUF-block matmul per type among them) beside its torch twin, with the timing they share."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

log = logging.getLogger("engine.bench.gpu")


@dataclass(frozen=True)
class KernelRow:
    name: str
    ms: float  # Triton kernel, median
    ref_ms: float  # torch twin, median
    amount: float  # bytes moved, or FLOPs for compute-bound rows
    unit: str  # "GB/s" or "TFLOP/s"


# ----------------------------------------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int = 3, iters: int = 20) -> float:
    """Median wall time of fn() in milliseconds, each call synchronized (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    sync(device)
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
    rows += gguf_kernel_rows(device)
    return rows


# The GGUF types of the common files (Q4_K_M holds Q4_K and Q6_K; Q5_K_M Q5_K and Q6_K), on a weight of
# Llama 3.2 1B's MLP: [8192, 2048].
GGUF_TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")


def gguf_kernel_rows(device: torch.device, types: Sequence[str] = GGUF_TYPES, shape=(8192, 2048)) -> list[KernelRow]:
    """The Triton GGUF-block matmul against its twin (dequantize, then a float32 matmul): one row of x, a decode
    step, judged by the bytes of blocks read; 512 rows, a prompt, by its FLOPs."""
    from kernels.torch_ref import gguf_blocks
    from kernels.triton import gguf_matmul

    rows = []
    num_out, num_cols = shape
    for type_name in types:
        blocks = gguf_blocks.random_blocks(num_out, num_cols, type_name, seed=0).to(device)
        for num_rows in (1, 512):
            x = torch.randn(num_rows, num_cols, device=device, dtype=torch.bfloat16)
            decode = num_rows == 1
            rows.append(
                KernelRow(
                    f"{type_name} matmul [{num_rows}, {num_cols}] x [{num_out}, {num_cols}]",
                    time_ms(lambda x=x, b=blocks, t=type_name: gguf_matmul.linear(x, b, t), device),
                    time_ms(lambda x=x, b=blocks, t=type_name: gguf_blocks.linear(x, b, t), device),
                    blocks.numel() if decode else 2 * num_rows * num_out * num_cols,
                    "GB/s" if decode else "TFLOP/s",
                )
            )
        log.info("%s matmul done", type_name)
    return rows


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
