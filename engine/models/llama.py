"""Llama and Mistral: pre-norm decoder, grouped-query attention with rotary positions, SwiGLU MLP."""

from __future__ import annotations

import torch
from torch import nn

from engine.config.model import ModelConfig
from engine.models import decode_plan
from engine.models.base import Model
from engine.models.batch import Batch
from engine.models.decode_plan import DecodePlan
from engine.models.embedding import Embedding
from engine.models.layers import Attention, GatedMLP, RMSNorm
from engine.models.linear import Linear
from engine.models.rope import RotaryTable

# Our fused parameters and the checkpoint tensors they concatenate (on the output dimension).
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            qk_norm_eps=config.rms_norm_eps if config.qk_norm else None,
            sliding_window=config.sliding_window,
            layer_idx=layer_idx,
        )
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)

    def forward(self, x, residual, cos, sin, batch: Batch):
        if residual is None:
            residual = x
            h, _ = self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, cos, sin, batch)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class _Body(nn.Module):
    def __init__(self, config: ModelConfig, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, qkv_bias, o_bias) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(Model):
    architectures = ("LlamaForCausalLM", "MistralForCausalLM")

    def __init__(self, config: ModelConfig, rope_freq_factors: torch.Tensor | None = None):
        super().__init__(config)
        self.model = _Body(config, *self.projection_biases(config))
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope = RotaryTable.for_config(config, rope_freq_factors)

    @staticmethod
    def projection_biases(config: ModelConfig) -> tuple[bool, bool]:
        """(bias on q/k/v, bias on o) for this family."""
        return config.attention_bias, config.attention_bias

    def checkpoint_names(self, name: str) -> tuple[str, ...]:
        for fused, parts in _FUSED.items():
            if f".{fused}." in name:
                return tuple(name.replace(fused, part) for part in parts)
        return (name,)

    def tie_weights(self) -> None:
        self.lm_head.tie_to(self.model.embed_tokens.table)

    def _decode_plan(self, batch: Batch, inputs: torch.Tensor) -> DecodePlan | None:
        """The recorded decode step for this batch's row count (engine/models/decode_plan.py), made on first
        use; None where the step or the model is not covered."""
        if not decode_plan.covers(batch, inputs):
            return None
        plans = decode_plan.plans_for(self, batch.cache)
        rows = len(batch.query_lens)
        plan = plans.get(rows, False)
        if plan is False or (plan is not None and not plan.fits(batch)):
            pages = max(batch.cache.num_pages, batch.block_tables.shape[1])
            plans[rows] = plan = DecodePlan.record(self, batch.cache, rows, pages)
        return plan

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, batch: Batch) -> torch.Tensor:
        x = self.embed(inputs) if not inputs.is_floating_point() else inputs.to(self.dtype)
        cos, sin = self.rope.lookup_batch(positions, batch, x.dtype)
        plan = self._decode_plan(batch, inputs)
        if plan is not None:
            x, residual, logits = plan.run(x, cos, sin, batch)
            if logits is not None:  # a row's logits do not depend on the rows beside it
                return (logits if batch.logits_indices is None else logits[batch.logits_indices]).float()
        else:
            residual = None
            for layer in self.model.layers:
                x, residual = layer(x, residual, cos, sin, batch)
        if batch.logits_indices is not None:
            x, residual = x[batch.logits_indices], residual[batch.logits_indices]
        x, _ = self.model.norm(x, residual)
        return self.lm_head(x).float()
