"""The ops model code calls. Each forwards to `dispatch`, which picks the backend."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels import dispatch
from kernels.cpu import attention as cpu_attention
from kernels.cpu import blocks as cpu_blocks
from kernels.cpu import build as cpu_build
from kernels.cpu import elementwise as cpu_elementwise
from kernels.cpu import int4 as cpu_int4
from kernels.cpu import kv_quant as cpu_kv_quant
from kernels.cpu import moe_decode as cpu_moe_decode
from kernels.cpu import plan as cpu_plan
from kernels.cpu.plan import Plan
from kernels.torch_ref import activation, attention, delta_rule, gguf_blocks, gguf_repack, norm, quant, rope
from kernels.triton import candidates as triton_kernels  # imports triton itself only on the first CUDA call

dispatch.register("write_kv", attention.write_kv, reference=True)
dispatch.register("paged_attention", attention.paged_attention, reference=True)
dispatch.register("paged_attention_key_ends", attention.paged_attention_key_ends, reference=True)
# Attention with a learned sink logit per head (gpt-oss): Triton on CUDA (float and quantized pages), the C kernels
# on the CPU (float caches, then quantized ones), else the twin.
dispatch.register("paged_attention_sinks", attention.paged_attention_sinks, reference=True)
dispatch.register("paged_attention_sinks", triton_kernels.paged_attention_sinks)
dispatch.register("paged_attention_sinks", cpu_attention.paged_attention_sinks)
dispatch.register("paged_attention_sinks", cpu_kv_quant.paged_attention_sinks)
dispatch.register("rms_norm", norm.rms_norm, reference=True)
# Linear attention (Gated DeltaNet): its causal conv1d and the delta rule, prefill and decode forms; the twins only.
dispatch.register("causal_conv1d", delta_rule.causal_conv1d, reference=True)
dispatch.register("causal_conv1d_update", delta_rule.causal_conv1d_update, reference=True)
dispatch.register("gated_delta_rule_chunked", delta_rule.gated_delta_rule_chunked, reference=True)
dispatch.register("gated_delta_rule_recurrent", delta_rule.gated_delta_rule_recurrent, reference=True)
dispatch.register("apply_rope", rope.apply_rope, reference=True)
dispatch.register("silu_and_mul", activation.silu_and_mul, reference=True)
# Triton kernels go ahead of the twins; each declines (None) anything but CUDA tensors it can handle.
dispatch.register("write_kv", triton_kernels.write_kv)
dispatch.register("paged_attention", triton_kernels.paged_attention)
# Quantized pages (uint8 caches, kernels/torch_ref/kv_quant.py): each candidate declines float caches.
dispatch.register("write_kv", triton_kernels.write_kv_quant)
dispatch.register("paged_attention", triton_kernels.paged_attention_quant)
dispatch.register("paged_attention_key_ends", triton_kernels.paged_attention_key_ends_quant)
# The fused C decode kernel (compiled on first use) goes ahead of the twin for CPU decode steps.
dispatch.register("paged_attention", cpu_attention.paged_attention)
# ...and its quantized-page form, with the C write that quantizes new rows (each declines float caches).
dispatch.register("write_kv", cpu_kv_quant.write_kv)
dispatch.register("paged_attention", cpu_kv_quant.paged_attention)
dispatch.register("rms_norm", triton_kernels.rms_norm)
dispatch.register("apply_rope", triton_kernels.apply_rope)
dispatch.register("silu_and_mul", triton_kernels.silu_and_mul)
# bfloat16 CPU tensors: one C pass each instead of several torch ops.
dispatch.register("rms_norm", cpu_elementwise.rms_norm)
dispatch.register("apply_rope", cpu_elementwise.apply_rope)
dispatch.register("silu_and_mul", cpu_elementwise.silu_and_mul)
# A few rows of bf16 x: the C kernel unpacks the weight once for all of them; else torch's int4 kernel.
dispatch.register("linear_int4", cpu_int4.linear_int4)
dispatch.register("linear_int4", quant.linear_int4_cpu)
dispatch.register("linear_int4", quant.linear_int4, reference=True)
# GGUF block-quantized weights read in their own format: the C kernels, the Triton matmul on CUDA, else the twin.
dispatch.register("linear_blocks", cpu_blocks.linear)
dispatch.register("linear_blocks", triton_kernels.linear_blocks)
dispatch.register("linear_blocks", gguf_blocks.linear, reference=True)

# Whether the Triton kernels can run where a CUDA GPU is (triton importable; checked once, triton not imported).
triton_available = triton_kernels.is_available

# Packing is done once at load time, not dispatched: every backend reads the layout these produce.
can_pack_int4 = quant.can_pack
pack_int4 = quant.pack_int4
block_row_bytes = gguf_blocks.row_bytes
dequantize_blocks = gguf_blocks.dequantize  # a few rows at a time: embedding lookups


def can_keep_blocks(
    type_name: str, device: torch.device | str, dtype: torch.dtype, num_cols: int, num_rows: int
) -> bool:
    """True where a weight [num_rows, num_cols] of GGUF type `type_name` can stay in its blocks (or a repacked
    layout of the same size, `pack_blocks`) for `dtype` inputs on `device` at decode speed (a C kernel reads
    it); elsewhere the loader expands or repacks it otherwise, as the twin would expand it on every call."""
    return cpu_blocks.supports(type_name, device, dtype, num_cols, num_rows) or triton_kernels.blocks_supported(
        type_name, device, dtype, num_cols, num_rows
    )


def pack_blocks(blocks: torch.Tensor, type_name: str) -> tuple[torch.Tensor, str]:
    """A weight's file blocks -> (the layout its kernel reads, that layout's type name), once, at load. On a CPU
    the 32-value types are repacked 16 rows at a time ("Q4_0x16": kernels/torch_ref/gguf_repack.py), the same
    size; on a GPU the Triton matmul reads the file's layout as it is."""
    if blocks.device.type == "cuda":
        return blocks, type_name
    return cpu_blocks.pack(blocks, type_name)


def block_rows(blocks: torch.Tensor, type_name: str, ids: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Rows `ids` of a weight held as `type_name` blocks (packed or not), in the file's layout [len(ids), row
    bytes], with the file's type name: what an embedding lookup dequantizes."""
    if type_name.endswith(gguf_repack.SUFFIX):
        base = gguf_repack.base_name(type_name)
        return gguf_repack.rows(blocks, base, ids), base
    return blocks[ids.reshape(-1)], type_name


def block_num_rows(blocks: torch.Tensor, type_name: str) -> int:
    """The weight rows a blocks tensor holds (16 per row of repacked tiles)."""
    return blocks.shape[0] * (gguf_repack.GROUP if type_name.endswith(gguf_repack.SUFFIX) else 1)


def decode_plan() -> Plan | None:
    """An empty plan to record a decode step's C kernel calls into (kernels/cpu/plan.py), or None where the ops
    would not run the C kernels (TANDEM_FORCE_REFERENCE, or no compiler): a plan must compute what they do."""
    if any(getattr(fn, "__tandem_reference__", False) for fn in dispatch.candidates("rms_norm")[:1]):
        return None
    return Plan() if cpu_build.load("elementwise") is not None else None


# The argument lists of the C kernels, bound once to a plan's buffers: the same ones the ops above use.
bind_linear_blocks = cpu_blocks.bind_linear
bind_rms_norm = cpu_elementwise.bind_rms_norm
bind_rope = cpu_elementwise.bind_rope
bind_silu_and_mul = cpu_elementwise.bind_silu_and_mul
bind_write_slots = cpu_elementwise.bind_write_slots
bind_paged_decode = cpu_attention.bind_decode
bind_write_kv_quant = cpu_kv_quant.bind_write  # quantized pages (uint8 cache layers)
bind_paged_decode_quant = cpu_kv_quant.bind_decode
moe_expert_parts = cpu_moe_decode.expert_parts  # a mixture of experts' projections, for the two calls below
bind_moe_gate_up = cpu_moe_decode.bind_gate_up
bind_moe_down = cpu_moe_decode.bind_down
PlanError = cpu_plan.PlanError


# Build the C kernels ahead of the first CPU forward (kernels/cpu/build.py); a no-op once they are cached.
prepare_cpu_kernels = cpu_build.prepare


def write_kv(k_cache, v_cache, k, v, slot_mapping) -> None:
    dispatch.call("write_kv", k_cache, v_cache, k, v, slot_mapping)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None = None,
    page_runs: Sequence[int] | None = None,
) -> torch.Tensor:
    """Causal paged attention; `page_runs` (per sequence: first page id of a consecutive run, or -1) is
    a host-side hint that lets a backend read a sequence's pages as one view."""
    return dispatch.call(
        "paged_attention",
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_lens,
        seq_lens_host,
        scale,
        sliding_window,
        page_runs,
    )


def paged_attention_key_ends(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None,
    key_ends: torch.Tensor,
) -> torch.Tensor:
    """paged_attention where token t attends keys at positions < key_ends[t] (bidirectional runs)."""
    return dispatch.call(
        "paged_attention_key_ends",
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_lens,
        seq_lens_host,
        scale,
        sliding_window,
        key_ends,
    )


def paged_attention_sinks(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sinks: torch.Tensor,
    sliding_window: int | None = None,
    page_runs: Sequence[int] | None = None,
) -> torch.Tensor:
    """`paged_attention` where each query head's softmax also counts a learned logit `sinks` [Hq] (float32)
    that has no value: a head can attend to nothing (gpt-oss)."""
    return dispatch.call(
        "paged_attention_sinks",
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_lens,
        seq_lens_host,
        scale,
        sinks,
        sliding_window,
        page_runs,
    )


def rms_norm(x, weight, eps: float, residual=None):
    return dispatch.call("rms_norm", x, weight, eps, residual)


def apply_rope(x, cos, sin):
    return dispatch.call("apply_rope", x, cos, sin)


def silu_and_mul(x):
    return dispatch.call("silu_and_mul", x)


def linear_int4(x, packed, scales_and_zeros, group_size: int, bias=None, low=None):
    """x @ W.T (+ bias) for a 4-bit weight packed by `kernels.torch_ref.quant.pack_int4` (layout in that module);
    `low` = (packed, scales_and_zeros) of a second plane the weight is the sum with (an 8-bit weight)."""
    return dispatch.call("linear_int4", x, packed, scales_and_zeros, group_size, bias, low)


def linear_blocks(x, blocks, type_name: str, bias=None):
    """x @ W.T (+ bias) for W [N, K] held as rows of GGUF blocks of `type_name` (blocks [N, row bytes] uint8)."""
    return dispatch.call("linear_blocks", x, blocks, type_name, bias)


def causal_conv1d(x, weight, conv_states, slot: int):
    """SiLU(depthwise causal conv) of one sequence's inputs x [n, C], continuing its window conv_states[slot]
    (updated in place); kernels/torch_ref/delta_rule.py describes the state layout."""
    return dispatch.call("causal_conv1d", x, weight, conv_states, slot)


def causal_conv1d_update(x, weight, conv_states, slots):
    """causal_conv1d for one input per sequence: x [batch, C], sequence i's window at conv_states[slots[i]]."""
    return dispatch.call("causal_conv1d_update", x, weight, conv_states, slots)


def gated_delta_rule_chunked(q, k, v, g, beta, states, slot: int):
    """The gated delta rule over one sequence's new tokens (chunked form), from and into states[slot]."""
    return dispatch.call("gated_delta_rule_chunked", q, k, v, g, beta, states, slot)


def gated_delta_rule_recurrent(q, k, v, g, beta, states, slots):
    """The gated delta rule for one token per sequence (recurrent form), sequence i's state at states[slots[i]]."""
    return dispatch.call("gated_delta_rule_recurrent", q, k, v, g, beta, states, slots)
