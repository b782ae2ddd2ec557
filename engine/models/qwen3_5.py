"""Qwen3.5 (dense, text): a hybrid of Gated DeltaNet linear attention and gated full attention.

What differs from Qwen3, each as transformers' Qwen3_5ForCausalLM does it:

    layer types    `layer_types` (else every `full_attention_interval`-th layer, 4 by default, is full attention,
                   the rest linear): linear layers are engine/models/linear_attention.py, with a recurrent state
                   per sequence in the cache's slots instead of KV pages
    full attention q_proj gives each head its query and an output gate (per head: [query | gate]); the output is
                   multiplied by sigmoid(gate) before o_proj; rotary turns the first `partial_rotary_factor` of
                   each head only. M-RoPE's three position rows are equal for text, which is plain RoPE.
    RMSNorm        scales by (1 + weight) in float32, rounded once (as Gemma's); q/k norms too
    decoder layer  x + mixer(input_norm(x));  x + mlp(post_attention_norm(x))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from engine.config.model import ModelConfig
from engine.errors import ModelLoadError
from engine.models.base import Model
from engine.models.batch import Batch
from engine.models.embedding import Embedding
from engine.models.gemma3.text import GemmaRMSNorm
from engine.models.layers import GatedMLP
from engine.models.linear import Linear
from engine.models.linear_attention import GatedDeltaNet, StateSteps
from engine.models.rope import RotaryTable
from kernels import ops

_LAYER_TYPES = ("linear_attention", "full_attention")
# Our fused parameters and the checkpoint tensors they concatenate (on the output dimension).
_FUSED = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "in_proj": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
}
_RENAMED = {".linear_attn.conv_weight": ".linear_attn.conv1d.weight"}


@dataclass(frozen=True)
class Qwen3_5Settings:
    """The Qwen3.5-only part of a text config (absent keys take transformers' Qwen3_5TextConfig defaults)."""

    is_linear: tuple[bool, ...]  # per layer
    conv_kernel: int
    num_k_heads: int
    num_v_heads: int
    key_dim: int
    value_dim: int
    partial_rotary_factor: float  # the fraction of each full-attention head that rotary turns (its first dims)

    @classmethod
    def from_config(cls, config: ModelConfig) -> Qwen3_5Settings:
        d = config.extra
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ModelLoadError(f"config.json sets hidden_act={act!r}; Qwen3.5 layers run SiLU only.")
        try:
            rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
            factor = float(rope.get("partial_rotary_factor") or d.get("partial_rotary_factor") or 0.25)
            settings = cls(
                is_linear=_linear_layers(d, config.num_hidden_layers),
                conv_kernel=int(d.get("linear_conv_kernel_dim", 4)),
                num_k_heads=int(d.get("linear_num_key_heads", 16)),
                num_v_heads=int(d.get("linear_num_value_heads", 32)),
                key_dim=int(d.get("linear_key_head_dim", 128)),
                value_dim=int(d.get("linear_value_head_dim", 128)),
                partial_rotary_factor=factor,
            )
        except (TypeError, ValueError, AttributeError) as e:
            raise ModelLoadError(f"config.json has a Qwen3.5 setting of the wrong type: {e}") from None
        sizes = (settings.conv_kernel, settings.num_k_heads, settings.num_v_heads, settings.key_dim, settings.value_dim)
        if min(sizes) < 1 or settings.num_v_heads % settings.num_k_heads:
            raise ModelLoadError(
                "config.json's linear-attention sizes do not fit together: linear_conv_kernel_dim, the head counts "
                "and head dims must be positive and linear_num_value_heads a multiple of linear_num_key_heads, got "
                f"{sizes}. The file is damaged; re-download it."
            )
        rotary_dim = int(config.head_dim * factor)
        if not 0 < factor <= 1 or rotary_dim < 2 or rotary_dim % 2:
            raise ModelLoadError(
                f"config.json's partial_rotary_factor {factor} gives {rotary_dim} rotary dims of a head of "
                f"{config.head_dim}; it must give an even number from 2 to head_dim."
            )
        return settings


def _linear_layers(d: dict[str, Any], num_layers: int) -> tuple[bool, ...]:
    """Which layers are linear attention: `layer_types`, else all but every `full_attention_interval`-th."""
    types = d.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers or any(t not in _LAYER_TYPES for t in types):
            raise ModelLoadError(
                f"config.json layer_types should list one of {', '.join(_LAYER_TYPES)} for each of the "
                f"{num_layers} layers, got {types!r}."
            )
        return tuple(t == "linear_attention" for t in types)
    interval = int(d.get("full_attention_interval") or 4)
    return tuple((i + 1) % interval != 0 for i in range(num_layers))


class GatedAttention(nn.Module):
    """Grouped-query attention with (1 + w) q/k norms, partial rotary and a sigmoid output gate per channel."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = config.attention_bias
        self.qkv_proj = Linear(config.hidden_size, 2 * q_size + 2 * kv_size, bias=bias)  # q and gate, k, v
        self.o_proj = Linear(q_size, config.hidden_size, bias=bias)
        self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: Batch) -> torch.Tensor:
        num_tokens, dim = x.shape[0], self.head_dim
        q_size, kv_size = self.num_heads * dim, self.num_kv_heads * dim
        qkv = self.qkv_proj(x)
        q_gate = qkv[:, : 2 * q_size].view(num_tokens, self.num_heads, 2 * dim)  # per head: [query | gate]
        gate = q_gate[..., dim:].reshape(num_tokens, q_size)
        q = self.q_norm(q_gate[..., :dim])  # [num_tokens, Hq, D]
        k = self.k_norm(qkv[:, 2 * q_size : 2 * q_size + kv_size].view(num_tokens, self.num_kv_heads, dim))
        v = qkv[:, 2 * q_size + kv_size :].view(num_tokens, self.num_kv_heads, dim)
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        cache = batch.cache
        k_cache, v_cache = cache.k[self.layer_idx], cache.v[self.layer_idx]
        tables, slots, runs = batch.pages_of(self.layer_idx)
        ops.write_kv(k_cache, v_cache, k, v, slots)
        o = ops.paged_attention(
            q, k_cache, v_cache, tables, batch.seq_lens, batch.query_lens, batch.seq_lens_host, self.scale, None, runs
        )
        return self.o_proj(o.reshape(num_tokens, q_size).to(x.dtype) * torch.sigmoid(gate))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, settings: Qwen3_5Settings, layer_idx: int):
        super().__init__()
        self.is_linear = settings.is_linear[layer_idx]
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(
                config.hidden_size,
                settings.num_k_heads,
                settings.num_v_heads,
                settings.key_dim,
                settings.value_dim,
                settings.conv_kernel,
                config.rms_norm_eps,
                layer_idx,
            )
        else:
            self.self_attn = GatedAttention(config, layer_idx)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, bias=False)

    def forward(self, x, cos, sin, batch: Batch, steps: StateSteps) -> torch.Tensor:
        h = self.input_layernorm(x)
        h = self.linear_attn(h, batch, steps) if self.is_linear else self.self_attn(h, cos, sin, batch)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class _Body(nn.Module):
    def __init__(self, config: ModelConfig, settings: Qwen3_5Settings):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, settings, i) for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen3_5ForCausalLM(Model):
    """Qwen3.5's text model over a paged KV cache (its full-attention layers) and recurrent-state slots (its
    linear-attention layers), both owned by the cache; transformers' Qwen3_5ForCausalLM."""

    architectures = ("Qwen3_5ForCausalLM",)

    def __init__(self, config: ModelConfig, settings: Qwen3_5Settings | None = None):
        super().__init__(config)
        self.settings = settings or Qwen3_5Settings.from_config(config)
        self.model = _Body(config, self.settings)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        # transformers' default partial_rotary_factor is 0.25 for this family (1 for the others)
        self.rope = RotaryTable.for_config(replace(config, partial_rotary_factor=self.settings.partial_rotary_factor))

    def checkpoint_names(self, name: str) -> tuple[str, ...]:
        for fused, parts in _FUSED.items():
            if f".{fused}." in name:
                return tuple(name.replace(f".{fused}.", f".{part}.") for part in parts)
        for ours, theirs in _RENAMED.items():
            if name.endswith(ours):
                return (name[: -len(ours)] + theirs,)
        return (name,)

    def tie_weights(self) -> None:
        self.lm_head.tie_to(self.model.embed_tokens.table)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, batch: Batch) -> torch.Tensor:
        x = self.embed(inputs) if not inputs.is_floating_point() else inputs.to(self.dtype)
        cos, sin = self.rope.lookup(positions, max(batch.seq_lens_host), x.dtype)
        steps = StateSteps.of(batch)
        for layer in self.model.layers:
            x = layer(x, cos, sin, batch, steps)
        if batch.logits_indices is not None:
            x = x[batch.logits_indices]
        return self.lm_head(self.model.norm(x)).float()
