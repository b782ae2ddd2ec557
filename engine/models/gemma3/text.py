"""Gemma 3 text model: Llama's attention and gated MLP with Gemma's own numerics and layer layout.

What differs from Llama, each as transformers' Gemma3TextModel does it:

    embeddings     scaled by sqrt(hidden_size), the scale rounded to the model dtype first
    RMSNorm        scales by (1 + weight), in float32, rounded once at the end
    decoder layer  x + post_attn_norm(attn(input_norm(x)));  x + post_ffw_norm(mlp(pre_ffw_norm(x)))
    attention      RMSNorm over each head of q and k before rotary; scale query_pre_attn_scalar ** -0.5
    layer types    "sliding_attention" layers see the last `sliding_window` positions and use the local
                   rotary base (rope_local_base_freq); "full_attention" layers see everything and use
                   rope_theta with the checkpoint's rope scaling
    MLP            gelu (tanh approximation) gate instead of SiLU
    logits         tanh soft-capped when final_logit_softcapping is set
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from engine.config.model import ModelConfig, RopeScaling
from engine.errors import ModelLoadError
from engine.models.base import Model
from engine.models.batch import Batch
from engine.models.embedding import Embedding
from engine.models.layers import Attention
from engine.models.linear import Linear
from engine.models.rope import RotaryTable
from engine.vision.layers import activation
from kernels import ops

_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_LAYER_TYPES = ("sliding_attention", "full_attention")
# transformers' Gemma3TextConfig defaults for the keys only Gemma reads (the shared ones are in engine.config.model).
_GLOBAL_THETA = 1_000_000.0
_LOCAL_THETA = 10_000.0
_SLIDING_WINDOW_PATTERN = 6


@dataclass(frozen=True)
class RopeSettings:
    theta: float
    scaling: RopeScaling | None


@dataclass(frozen=True)
class Gemma3TextSettings:
    """The Gemma-only part of a text config, parsed from its dict (absent keys take transformers' defaults)."""

    query_pre_attn_scalar: float
    sliding_window: int | None
    is_sliding: tuple[bool, ...]  # per layer
    local_rope: RopeSettings
    global_rope: RopeSettings
    final_logit_softcapping: float | None
    hidden_activation: str

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], num_layers: int) -> Gemma3TextSettings:
        if d.get("attn_logit_softcapping") is not None:
            raise ModelLoadError(
                f"config.json sets attn_logit_softcapping={d['attn_logit_softcapping']!r}; Tandem's Gemma 3 "
                "attention has no soft-capping (no released Gemma 3 checkpoint uses it). Use a checkpoint without it."
            )
        if d.get("use_bidirectional_attention"):
            raise ModelLoadError(
                "config.json sets use_bidirectional_attention: this is an embedding model (every token sees every "
                "other), not a text generator, so Tandem cannot run it."
            )
        window = d.get("sliding_window", 4096)
        try:
            return cls(
                query_pre_attn_scalar=float(d.get("query_pre_attn_scalar") or 256),
                sliding_window=int(window) if window else None,
                is_sliding=_sliding_layers(d, num_layers),
                local_rope=_rope_settings(d, "sliding_attention"),
                global_rope=_rope_settings(d, "full_attention"),
                final_logit_softcapping=_optional_float(d.get("final_logit_softcapping")),
                hidden_activation=str(d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"),
            )
        except (TypeError, ValueError) as e:
            raise ModelLoadError(f"config.json has a Gemma 3 setting of the wrong type: {e}") from None


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _sliding_layers(d: dict[str, Any], num_layers: int) -> tuple[bool, ...]:
    """Which layers use the sliding window: `layer_types`, else every layer but each `pattern`-th one."""
    types = d.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers or any(t not in _LAYER_TYPES for t in types):
            raise ModelLoadError(
                f"config.json layer_types should list one of {', '.join(_LAYER_TYPES)} for each of the "
                f"{num_layers} layers, got {types!r}."
            )
        return tuple(t == "sliding_attention" for t in types)
    pattern = int(d.get("sliding_window_pattern") or d.get("_sliding_window_pattern") or _SLIDING_WINDOW_PATTERN)
    return tuple((i + 1) % pattern != 0 for i in range(num_layers))


def _rope_settings(d: dict[str, Any], layer_type: str) -> RopeSettings:
    """Rotary base and scaling of one layer type, from transformers 5's per-type `rope_parameters` or the
    older flat keys (rope_theta + rope_scaling for full layers, rope_local_base_freq for sliding ones)."""
    params = d.get("rope_parameters")
    if isinstance(params, dict) and any(t in params for t in _LAYER_TYPES):
        own = params.get(layer_type) or {}
        default = _LOCAL_THETA if layer_type == "sliding_attention" else _GLOBAL_THETA
        return RopeSettings(float(own.get("rope_theta", default)), RopeScaling.from_dict(own))
    if layer_type == "sliding_attention":
        return RopeSettings(float(d.get("rope_local_base_freq") or _LOCAL_THETA), None)
    flat = d.get("rope_scaling") or (params if isinstance(params, dict) else None)
    theta = d.get("rope_theta") or (flat or {}).get("rope_theta") or _GLOBAL_THETA
    return RopeSettings(float(theta), RopeScaling.from_dict(flat))


def _rotary(config: ModelConfig, rope: RopeSettings) -> RotaryTable:
    return RotaryTable.for_config(replace(config, rope_theta=rope.theta, rope_scaling=rope.scaling))


class GemmaRMSNorm(nn.Module):
    """RMSNorm scaled by (1 + weight): checkpoints store the scale minus one, so zeros are the identity."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # All in float32 and rounded once at the end (Llama rounds before the scale): the reference's order.
        out, _ = ops.rms_norm(x.float(), 1.0 + self.weight.float(), self.eps)
        return out.to(x.dtype)


class Gemma3Attention(Attention):
    """Grouped-query attention with Gemma's q/k norms and scale; `key_ends` lets image tokens look ahead."""

    def __init__(self, config: ModelConfig, settings: Gemma3TextSettings, layer_idx: int):
        super().__init__(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            qkv_bias=config.attention_bias,
            o_bias=config.attention_bias,
            qk_norm_eps=None,
            sliding_window=settings.sliding_window if settings.is_sliding[layer_idx] else None,
            layer_idx=layer_idx,
        )
        self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.scale = settings.query_pre_attn_scalar**-0.5

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: Batch, key_ends: torch.Tensor | None = None
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q = qkv[:, :q_size].view(-1, self.num_heads, self.head_dim)  # [num_tokens, Hq, D]
        k = qkv[:, q_size : q_size + kv_size].view(-1, self.num_kv_heads, self.head_dim)  # [num_tokens, Hkv, D]
        v = qkv[:, q_size + kv_size :].view(-1, self.num_kv_heads, self.head_dim)
        q = ops.apply_rope(self.q_norm(q), cos, sin)
        k = ops.apply_rope(self.k_norm(k), cos, sin)
        k_cache, v_cache = batch.cache.k[self.layer_idx], batch.cache.v[self.layer_idx]
        tables, slots, _ = batch.pages_of(self.layer_idx)
        ops.write_kv(k_cache, v_cache, k, v, slots)
        args = (
            q,
            k_cache,
            v_cache,
            tables,
            batch.seq_lens,
            batch.query_lens,
            batch.seq_lens_host,
            self.scale,
            self.sliding_window,
        )
        o = ops.paged_attention(*args) if key_ends is None else ops.paged_attention_key_ends(*args, key_ends)
        return self.o_proj(o.reshape(-1, q_size).to(x.dtype))


class Gemma3MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, act: str):
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)
        self.act = activation(act, "hidden_activation")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, settings: Gemma3TextSettings, layer_idx: int):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.is_sliding = settings.is_sliding[layer_idx]
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.self_attn = Gemma3Attention(config, settings, layer_idx)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.mlp = Gemma3MLP(hidden, config.intermediate_size, settings.hidden_activation)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(self, x, cos, sin, batch: Batch, key_ends: torch.Tensor | None) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), cos, sin, batch, key_ends)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h)


class _Body(nn.Module):
    def __init__(self, config: ModelConfig, settings: Gemma3TextSettings):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)  # a GGUF's table may stay in blocks
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, settings, i) for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class Gemma3ForCausalLM(Model):
    """Gemma 3's text model over a paged KV cache (transformers' Gemma3ForCausalLM).

    `rope` is the full-attention layers' rotary table and `local_rope` the sliding layers'. `run` is
    `forward` with `key_ends` (see kernels.ops.paged_attention_key_ends), which the vision-language model
    uses to let an image's tokens attend to each other in both directions.
    """

    architectures = ("Gemma3ForCausalLM",)

    def __init__(self, config: ModelConfig, settings: Gemma3TextSettings | None = None):
        super().__init__(config)
        if settings is None:
            settings = Gemma3TextSettings.from_hf_dict(config.extra, config.num_hidden_layers)
        self.settings = settings
        self.model = _Body(config, settings)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope = _rotary(config, settings.global_rope)
        self.local_rope = _rotary(config, settings.local_rope)

    def checkpoint_names(self, name: str) -> tuple[str, ...]:
        for fused, parts in _FUSED.items():
            if f".{fused}." in name:
                return tuple(name.replace(fused, part) for part in parts)
        return (name,)

    def tie_weights(self) -> None:
        self.lm_head.tie_to(self.model.embed_tokens.table)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Scaled token embeddings [num_tokens, hidden]."""
        rows = self.model.embed_tokens(input_ids)  # in the weights' dtype (or the blocks' target dtype)
        # sqrt(hidden) goes through float32 to the weights' dtype before the product, as in the reference
        # (in bfloat16 sqrt(3072) becomes 55.5), so embeddings match it bit for bit.
        scale = torch.tensor(self.config.hidden_size**0.5, dtype=torch.float32).to(rows.device, rows.dtype)
        return rows * scale

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.run(inputs, positions, batch)

    def run(
        self, inputs: torch.Tensor, positions: torch.Tensor, batch: Batch, key_ends: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`forward`, with each new token attending keys before `key_ends[token]` (None: causal)."""
        x = self.embed(inputs) if not inputs.is_floating_point() else inputs.to(self.dtype)
        longest = max(batch.seq_lens_host)
        local = self.local_rope.lookup(positions, longest, x.dtype)
        full = self.rope.lookup(positions, longest, x.dtype)
        for layer in self.model.layers:
            cos, sin = local if layer.is_sliding else full
            x = layer(x, cos, sin, batch, key_ends)
        if batch.logits_indices is not None:
            x = x[batch.logits_indices]
        logits = self.lm_head(self.model.norm(x)).float()
        cap = self.settings.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits
