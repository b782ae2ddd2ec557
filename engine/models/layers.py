"""Building blocks shared by the Llama-family models. Checkpoint names never appear here."""

from __future__ import annotations

import torch
from torch import nn

from engine.models.batch import Batch
from engine.models.linear import Linear
from kernels import ops


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return ops.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    """Grouped-query attention with fused q/k/v projection, optional per-head q/k norm, over paged KV."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm_eps: float | None,
        sliding_window: int | None,
        layer_idx: int,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.layer_idx = layer_idx
        self.sliding_window = sliding_window
        self.rotary = True  # False: q and k go unrotated, attending by content alone (SmolLM3's no-rope layers)
        self.scale = head_dim**-0.5
        self.qkv_proj = Linear(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, bias=qkv_bias)
        self.o_proj = Linear(num_heads * head_dim, hidden_size, bias=o_bias)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: Batch) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q = qkv[:, :q_size].view(-1, self.num_heads, self.head_dim)  # [num_tokens, Hq, D]
        k = qkv[:, q_size : q_size + kv_size].view(-1, self.num_kv_heads, self.head_dim)  # [num_tokens, Hkv, D]
        v = qkv[:, q_size + kv_size :].view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, _ = self.q_norm(q)
            k, _ = self.k_norm(k)
        if self.rotary:
            q = ops.apply_rope(q, cos, sin)
            k = ops.apply_rope(k, cos, sin)
        else:  # packed heads, as rope leaves them, for the kernels that read them
            q, k = q.contiguous(), k.contiguous()
        cache = batch.cache
        k_cache, v_cache = cache.k[self.layer_idx], cache.v[self.layer_idx]
        tables, slots, runs = batch.pages_of(self.layer_idx)
        ops.write_kv(k_cache, v_cache, k, v, slots)
        o = ops.paged_attention(
            q,
            k_cache,
            v_cache,
            tables,
            batch.seq_lens,
            batch.query_lens,
            batch.seq_lens_host,
            self.scale,
            self.sliding_window,
            runs,
        )
        return self.o_proj(o.reshape(-1, q_size).to(x.dtype))


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))
