"""Decode steps of Llama-family decoders replayed as a recorded list of C kernel calls (kernels/cpu/plan.py).

A step where every sequence adds one token is the same ~10 kernel calls per layer each time, on tensors of the
same shapes; only the token embeddings, rotary rows, page tables, lengths and cache slots change. The plan
records those calls once per row count, bound to buffers it owns, and a step refills the inputs and replays
them; the final norm and the output head too, where the head is held in GGUF blocks. A small model's step is
mostly Python and dispatch overhead through the modules, which the plan removes.

Each call is the one the layer's modules would make, with the same arguments (the ops' own `bind_*`
functions), so a planned step gives the same bits as `DecoderLayer.forward`; tests/engine/models/
test_decode_plan.py holds it to that. Llama, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k norms), Phi-3 (partial
rotary) and SmolLM3 (layers without rotary) layers are covered, over bfloat16 pages or quantized ones
(cache.kv_format "q8", "q6", "q4": uint8 layers, written and read by kernels/cpu/kv_quant.py's kernels, as the
ops dispatch them). So are mixture-of-experts MLPs (Qwen3-MoE; gpt-oss, with its attention sinks bound into the
attention call): the route runs as the module's torch ops, the experts in two C calls around the activation
(kernels/cpu/moe_decode.c) over each routed expert's slice of the packed blocks, with the module's roundings;
float experts run as the module inside the plan. A model or batch the plan does not cover
(float or int4 weights, Gemma 3's layers, CUDA, prompt tokens in the batch, TANDEM_FORCE_REFERENCE) takes the
modules.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.models.batch import Batch
from engine.models.moe import SparseMoE
from kernels import ops

MAX_ROWS = 32  # decode rows a plan is recorded for; larger batches are arithmetic-bound anyway
_FLOAT_ROUTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a MoE router's float32 weights, by module


@dataclass
class _Inputs:
    x: torch.Tensor  # [rows, hidden] the token embeddings
    cos: torch.Tensor  # [rows, rotary dims]
    sin: torch.Tensor
    tables: torch.Tensor  # [rows, pages] int64
    lens: torch.Tensor  # [rows] int64
    slots: torch.Tensor  # [rows] int64: each new token's cache slot (page * page_size + offset)
    # the same two in window slots, for sliding-window layers the cache keeps apart (engine/cache/window.py)
    window_tables: torch.Tensor | None = None
    window_slots: torch.Tensor | None = None

    def pages_of(self, windowed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.window_tables, self.window_slots) if windowed else (self.tables, self.slots)


class DecodePlan:
    """One row count's recorded step over one cache. `run` returns the hidden state and residual after the last
    layer, and the head's bfloat16 logits where the plan holds the final norm and the head (None otherwise)."""

    def __init__(
        self,
        plan: ops.Plan,
        inputs: _Inputs,
        out: tuple[torch.Tensor, torch.Tensor],
        cache,
        rows: int,
        head: tuple[ops.Plan, torch.Tensor] | None,
    ):
        self._plan, self._in, self._out, self.cache, self.rows = plan, inputs, out, cache, rows
        self._head = head  # the final norm and head's calls and their logits buffer

    @classmethod
    def record(cls, model, cache, rows: int, pages: int) -> DecodePlan | None:
        """A plan for `rows` one-token sequences of up to `pages` pages each in `cache`, or None where one
        of the model's layers is not covered."""
        plan = ops.decode_plan()
        config = model.config
        if plan is None or model.dtype != torch.bfloat16 or cache.dtype != torch.bfloat16 or cache.device.type != "cpu":
            return None
        hidden, rot = config.hidden_size, model.rope.inv_freq.numel() * 2
        inputs = _Inputs(
            x=plan.buffer(rows, hidden),
            cos=plan.buffer(rows, rot),
            sin=plan.buffer(rows, rot),
            tables=plan.buffer(rows, pages, dtype=torch.int64),
            lens=plan.buffer(rows, dtype=torch.int64),
            slots=plan.buffer(rows, dtype=torch.int64),
        )
        if cache.window_layers:
            inputs.window_tables = plan.buffer(rows, pages, dtype=torch.int64)
            inputs.window_slots = plan.buffer(rows, dtype=torch.int64)
        x, residual = inputs.x, None
        for index, layer in enumerate(model.model.layers):
            pages_of = inputs.pages_of(index in cache.window_layers)
            out = _record_layer(plan, layer, cache.k[index], cache.v[index], inputs, pages_of, x, residual)
            if out is None:
                return None
            x, residual = out
        # The final norm and the head, apart: a head the kernels do not take (float weights) leaves them to the
        # modules. Run as modules, their torch ops would start right after the step's weights had streamed
        # through the CPU caches and evicted what those ops need.
        head = ops.decode_plan()
        logits = None if head is None else _record_head(head, model, x, residual)
        return cls(plan, inputs, (x, residual), cache, rows, None if logits is None else (head, logits))

    def fits(self, batch: Batch) -> bool:
        return batch.block_tables.shape[1] <= self._in.tables.shape[1]

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: Batch):
        inputs = self._in
        inputs.x.copy_(x)
        inputs.cos.copy_(cos)
        inputs.sin.copy_(sin)
        inputs.tables[:, : batch.block_tables.shape[1]].copy_(batch.block_tables)
        inputs.lens.copy_(batch.seq_lens)
        inputs.slots.copy_(batch.slot_mapping)
        if inputs.window_tables is not None:
            inputs.window_tables[:, : batch.window_tables.shape[1]].copy_(batch.window_tables)
            inputs.window_slots.copy_(batch.window_slots)
        self._plan.run()
        if self._head is None:
            return (*self._out, None)
        head, logits = self._head
        head.run()
        return (*self._out, logits)


def plans_for(model, cache) -> dict[int, DecodePlan | None]:
    """The plans of `model` over `cache`, by row count (None: not covered). They are kept on the cache, which
    they write into, so they go when it goes; a truncated draft (a shallow copy of the model) has its own."""
    by_model = cache.__dict__.setdefault("_decode_plans", weakref.WeakKeyDictionary())
    return by_model.setdefault(model, {})


def covers(batch: Batch, inputs: torch.Tensor) -> bool:
    """True for a step a plan can take: 1 to MAX_ROWS sequences adding one token each, on the CPU."""
    rows = len(batch.query_lens)
    return (
        0 < rows <= MAX_ROWS
        and batch.num_tokens == rows
        and inputs.device.type == "cpu"
        and (batch.logits_indices is None or batch.logits_indices.shape[0] == rows)
    )


def _record_layer(plan, layer, k_cache, v_cache, inputs: _Inputs, pages, x, residual):
    """Append one DecoderLayer's calls; returns its (output, residual) buffers, or None if not covered."""
    attn, mlp = layer.self_attn, layer.mlp
    if type(mlp).__name__ != "GatedMLP" and not isinstance(mlp, SparseMoE):
        return None
    rows, threads = x.shape[0], plan.threads
    # the first layer's residual is its input (DecoderLayer.forward); later ones add the previous output
    h = plan.buffer(rows, x.shape[1])
    summed = None if residual is None else plan.buffer(rows, x.shape[1])
    if not plan.add(
        ops.bind_rms_norm(x, residual, summed, layer.input_layernorm.weight, layer.input_layernorm.eps, h, threads)
    ):
        return None
    residual = x if residual is None else summed
    heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
    qkv = _record_linear(plan, attn.qkv_proj, h)
    if qkv is None:
        return None
    q_size, kv_size = heads * dim, kv_heads * dim
    q_in = qkv[:, :q_size].view(rows, heads, dim)
    k_in = qkv[:, q_size : q_size + kv_size].view(rows, kv_heads, dim)
    v = qkv[:, q_size + kv_size :].view(rows, kv_heads, dim)
    if attn.q_norm is not None:  # Qwen3: each head of q and k normed before rotary, a token at a time
        q_in, k_in = _record_head_norm(plan, attn.q_norm, q_in), _record_head_norm(plan, attn.k_norm, k_in)
        if q_in is None or k_in is None:
            return None
    q, k = plan.buffer(rows, heads, dim), plan.buffer(rows, kv_heads, dim)
    cos, sin = inputs.cos, inputs.sin
    if not attn.rotary:  # a turn by 0 (cos 1, sin 0: x * 1 + y * 0 is x exactly) packs q and k as rope would
        cos, sin = plan.buffer(*cos.shape).fill_(1.0), plan.buffer(*sin.shape)
    if not (
        plan.add(ops.bind_rope(q_in, cos, sin, q, threads)) and plan.add(ops.bind_rope(k_in, cos, sin, k, threads))
    ):
        return None
    o = plan.buffer(rows, heads, dim)
    if not _record_attention(plan, attn, q, k, v, k_cache, v_cache, inputs, pages, o):
        return None
    attn_out = _record_linear(plan, attn.o_proj, o.view(rows, q_size))
    if attn_out is None:
        return None
    h2, summed2 = plan.buffer(rows, x.shape[1]), plan.buffer(rows, x.shape[1])
    norm = layer.post_attention_layernorm
    if not plan.add(ops.bind_rms_norm(attn_out, residual, summed2, norm.weight, norm.eps, h2, threads)):
        return None
    if isinstance(mlp, SparseMoE):
        moe = _record_moe(plan, mlp, h2)
        return None if moe is None else (moe, summed2)
    gate_up = _record_linear(plan, mlp.gate_up_proj, h2)
    if gate_up is None:
        return None
    act = plan.buffer(rows, gate_up.shape[1] // 2)
    if not plan.add(ops.bind_silu_and_mul(gate_up, act, threads)):
        return None
    down = _record_linear(plan, mlp.down_proj, act)
    return None if down is None else (down, summed2)


def _record_attention(plan, attn, q, k, v, k_cache, v_cache, inputs: _Inputs, pages, o) -> bool:
    """Append the new keys' and values' write into their slots and the attention of q over the cache into o.
    `pages`: the layer's (tables, slots) buffers."""
    threads, window = plan.threads, attn.sliding_window
    (tables, slots), lens = pages, inputs.lens
    sinks = getattr(attn, "sinks", None)  # gpt-oss: a learned sink logit per query head, read as float32
    if sinks is not None:
        sinks = plan.buffer(*sinks.shape, dtype=torch.float32).copy_(sinks.detach().float())
    if k_cache.dtype == torch.uint8:  # quantized pages: rotated and quantized as they are written
        write = ops.bind_write_kv_quant(k, v, k_cache, v_cache, slots, threads)
        decode = ops.bind_paged_decode_quant(
            q, k_cache, v_cache, o, tables, lens, attn.scale, window, threads, sinks=sinks
        )
        return plan.add(write) and plan.add(decode)
    writes = [ops.bind_write_slots(new, cache, slots) for new, cache in ((k, k_cache), (v, v_cache))]
    if all(writes):
        for write in writes:
            plan.add(write)
    else:

        def write_kv(slots=slots, page_size=k_cache.shape[1]) -> None:  # as the twin writes a CPU cache
            pages, offsets = slots.div(page_size, rounding_mode="floor"), slots.remainder(page_size)
            k_cache.index_put_((pages, offsets), k)
            v_cache.index_put_((pages, offsets), v)

        plan.add_python(write_kv)
    return plan.add(
        ops.bind_paged_decode(q, k_cache, v_cache, o, tables, lens, attn.scale, window, threads, sinks=sinks)
    )


def _record_moe(plan, mlp: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """Append a mixture-of-experts MLP over x [rows, hidden]; returns its output buffer. The route (float32
    router, top-k, softmax) runs as the module's torch ops; the experts run in the C calls of
    kernels/cpu/moe_decode.c where their blocks are the block kernels', else as the module."""
    out = plan.buffer(*x.shape)
    rows, top_k = x.shape[0], mlp.top_k
    ids, weights = plan.buffer(rows, top_k, dtype=torch.int64), plan.buffer(rows, top_k)
    calls = _bind_experts(plan, mlp, x, ids, weights, out)
    if calls is None:

        def moe() -> None:
            out.copy_(mlp(x))

        plan.add_python(moe)
        return out

    router = _router(mlp.gate)

    def route() -> None:
        routed, experts = mlp.route(x, None if router is None else F.linear(x.float(), *router))
        weights.copy_(routed)
        ids.copy_(experts)

    plan.add_python(route)
    for call in calls:
        if isinstance(call, tuple):
            plan.add(call)
        else:
            plan.add_python(call)
    return out


def _router(gate) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """A float router's weight and bias in float32, converted once for all of a model's plans (1 MB a layer in
    Qwen3-30B-A3B; SparseMoE._router_logits converts the same values at every call); None for a quantized router,
    which the module runs."""
    if gate.is_quantized:
        return None
    if gate not in _FLOAT_ROUTERS:
        bias = None if gate.bias is None else gate.bias.detach().float()
        _FLOAT_ROUTERS[gate] = (gate.weight.detach().float(), bias)
    return _FLOAT_ROUTERS[gate]


def _bind_experts(plan, mlp: SparseMoE, x, ids, weights, out) -> list | None:
    """The experts' calls (bound kernels, or Python steps for an activation the C kernels do not have), or
    None where their blocks are not the block kernels'."""
    tables = []
    for experts in (mlp.experts_gate_up, mlp.experts_down):
        if not experts.block_types:  # float experts
            return None
        blocks = [getattr(experts, f"blocks{i}") for i in range(len(experts.block_types))]
        table = ops.moe_expert_parts(blocks, experts.block_types, experts.num_experts, experts.in_features)
        if table is None:
            return None
        tables.append(plan.buffer(*table.shape, dtype=torch.int64).copy_(table))
    pairs, hidden = x.shape[0] * mlp.top_k, x.shape[1]
    width = mlp.experts_gate_up.out_features
    order, gathered = plan.buffer(pairs, dtype=torch.int64), plan.buffer(pairs, hidden)
    gate_up, act, down = plan.buffer(pairs, width), plan.buffer(pairs, width // 2), plan.buffer(pairs, hidden)
    gate_up_bias, down_bias = mlp.experts_gate_up.bias, mlp.experts_down.bias
    first = ops.bind_moe_gate_up(x, ids, tables[0], gate_up_bias, order, gathered, gate_up, plan.threads)
    last = ops.bind_moe_down(act, ids, weights, order, tables[1], down_bias, down, out, plan.threads)
    if type(mlp).activate is SparseMoE.activate:  # SiLU-and-multiply, as ops.silu_and_mul computes it
        activation = ops.bind_silu_and_mul(gate_up, act, plan.threads)
    else:  # the model's own (gpt-oss's clamped SwiGLU): elementwise, so all pairs at once give each its bits

        def activation() -> None:
            act.copy_(mlp.activate(gate_up))

    return None if first is None or last is None or activation is None else [first, activation, last]


def _record_head(plan, model, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor | None:
    """Append the final norm and the output head (as the model's forward computes them); returns the logits
    buffer [rows, vocab], or None where the head is not held in GGUF blocks."""
    norm, hidden = model.model.norm, x.shape[1]
    h, summed = plan.buffer(x.shape[0], hidden), plan.buffer(x.shape[0], hidden)
    if not plan.add(ops.bind_rms_norm(x, residual, summed, norm.weight, norm.eps, h, plan.threads)):
        return None
    return _record_linear(plan, model.lm_head, h)


def _record_head_norm(plan, norm, x: torch.Tensor) -> torch.Tensor | None:
    """Append RMSNorm over each head of x [rows, heads, head_dim] (a view into the fused projection), one call
    per token (the rows of one token are evenly spaced); returns the normed [rows, heads, head_dim] buffer."""
    out = plan.buffer(*x.shape)
    for row in range(x.shape[0]):
        if not plan.add(ops.bind_rms_norm(x[row], None, None, norm.weight, norm.eps, out[row], plan.threads)):
            return None
    return out


def _record_linear(plan, linear, x: torch.Tensor) -> torch.Tensor | None:
    """Append a projection held in GGUF blocks (one call per part, each writing its columns of one buffer,
    which is what Linear.forward's concatenation holds), then its bias (Qwen2's q/k/v) added in place as
    Linear.forward adds it; None for float or int4 weights."""
    if not linear.block_types or (linear.bias is not None and linear.bias.dtype != torch.bfloat16):
        return None
    parts = [(getattr(linear, f"blocks{i}"), t) for i, t in enumerate(linear.block_types)]
    out = plan.buffer(x.shape[0], linear.out_features)
    start = 0
    for blocks, type_name in parts:
        width = ops.block_num_rows(blocks, type_name)
        if not plan.add(ops.bind_linear_blocks(x, blocks, type_name, out[:, start : start + width], plan.threads)):
            return None
        start += width
    if start != linear.out_features:
        return None
    if linear.bias is not None:
        bias = linear.bias

        def add_bias() -> None:
            torch.add(out, bias, out=out)

        plan.add_python(add_bias)
    return out
