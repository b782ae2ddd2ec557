"""Gated DeltaNet, the linear-attention layer of Qwen3.5 and Qwen3-Next, over per-sequence recurrent-state slots.

    x -> in_proj -> [q k v | z | b | a]
         q k v -> causal conv1d (window in the slot) -> SiLU -> q, k [Hk, Dk], v [Hv, Dv]
         beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)      (log decay per value head)
         o = gated delta rule(q, k, v, g, beta)                           (state in the slot)
         out_proj(RMSNorm(o) * weight * SiLU(z))

The layer keeps no pages: its memory is the cache's slot pool (engine/cache/recurrent.py), which the Batch hands
it (`batch.state_of`). Sequences feeding one token run the recurrent form together; each sequence feeding several
runs the chunked form alone (kernels/torch_ref/delta_rule.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.cache.recurrent import StateShape
from engine.models.batch import Batch
from engine.models.linear import Linear
from kernels import ops


@dataclass(frozen=True)
class StateSteps:
    """How one forward's sequences meet their state slots; worked out once per forward for every linear layer."""

    fresh: torch.Tensor | None  # slots of sequences starting at position 0, zeroed before use (None: no such)
    step_rows: torch.Tensor | None  # token rows of the sequences feeding one token (None: no such)
    step_slots: torch.Tensor | None  # their slots
    all_steps: bool  # every row is a one-token sequence's, in order: the rows need no gathering
    runs: tuple[tuple[int, int, int], ...]  # (first row, number of tokens, slot) of each longer sequence

    @classmethod
    def of(cls, batch: Batch) -> StateSteps:
        device = batch.slot_mapping.device
        fresh = [slot for slot, past in zip(batch.state_slots, batch.past_lens) if past == 0]
        rows, slots, runs, start = [], [], [], 0
        for n, slot in zip(batch.query_lens, batch.state_slots):
            if n == 1:
                rows.append(start)
                slots.append(slot)
            else:
                runs.append((start, n, slot))
            start += n

        def tensor(ids: list[int]) -> torch.Tensor | None:
            return torch.tensor(ids, dtype=torch.int64, device=device) if ids else None

        return cls(tensor(fresh), tensor(rows), tensor(slots), not runs, tuple(runs))

    def by_sequence(
        self,
        inputs: tuple[torch.Tensor, ...],
        step: Callable[..., torch.Tensor],
        run: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        """step(*rows, slots) over the one-token sequences' rows together and run(*rows, slot) over each longer
        sequence's, put back in token order. `inputs` share their first (token) dim."""
        if self.all_steps:
            return step(*inputs, self.step_slots)
        if self.step_rows is None and len(self.runs) == 1:
            return run(*inputs, self.runs[0][2])
        parts: list[tuple[torch.Tensor | slice, torch.Tensor]] = []
        if self.step_rows is not None:
            parts.append((self.step_rows, step(*(t[self.step_rows] for t in inputs), self.step_slots)))
        for start, n, slot in self.runs:
            rows = slice(start, start + n)
            parts.append((rows, run(*(t[rows] for t in inputs), slot)))
        first = parts[0][1]
        out = first.new_empty((inputs[0].shape[0], *first.shape[1:]))
        for rows, value in parts:
            out[rows] = value
        return out


class GatedRMSNorm(nn.Module):
    """RMSNorm over each value head, then times SiLU(gate): in float32, rounded to the input's dtype before the
    weight and after the gate (transformers' Qwen3_5RMSNormGated)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(x.dtype)
        return (h * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """The linear-attention token mixer; `state_shape` tells the cache what one sequence's slot holds."""

    def __init__(
        self,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        key_dim: int,
        value_dim: int,
        conv_kernel: int,
        eps: float,
        layer_idx: int,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.key_dim, self.value_dim = key_dim, value_dim
        self.key_size, self.value_size = num_k_heads * key_dim, num_v_heads * value_dim
        self.conv_dim = 2 * self.key_size + self.value_size  # q, k and v go through the conv together
        self.conv_kernel = conv_kernel
        self.state_shape = StateShape(self.conv_dim, conv_kernel - 1, num_v_heads, key_dim, value_dim)
        # one matmul for q k v, z, b and a (the checkpoint's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a)
        self.in_proj = Linear(hidden_size, self.conv_dim + self.value_size + 2 * num_v_heads, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, 1, conv_kernel))  # depthwise: one filter each
        self.A_log = nn.Parameter(torch.empty(num_v_heads))  # decay rate per value head, log of
        self.dt_bias = nn.Parameter(torch.empty(num_v_heads))
        self.norm = GatedRMSNorm(value_dim, eps)
        self.out_proj = Linear(self.value_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, batch: Batch, steps: StateSteps) -> torch.Tensor:
        conv_states, delta_states = batch.state_of(self.layer_idx)
        if steps.fresh is not None:  # the state before a sequence's first token is zero
            conv_states.index_fill_(0, steps.fresh, 0)
            delta_states.index_fill_(0, steps.fresh, 0)
        num_tokens = x.shape[0]
        sizes = [self.conv_dim, self.value_size, self.num_v_heads, self.num_v_heads]
        mixed, z, b, a = self.in_proj(x).split(sizes, -1)
        weight = self.conv_weight.view(self.conv_dim, self.conv_kernel)
        mixed = steps.by_sequence(
            (mixed,),
            lambda rows, slots: ops.causal_conv1d_update(rows, weight, conv_states, slots),
            lambda rows, slot: ops.causal_conv1d(rows, weight, conv_states, slot),
        )  # [num_tokens, conv_dim]
        q, k, v = mixed.split([self.key_size, self.key_size, self.value_size], -1)
        q = q.reshape(num_tokens, self.num_k_heads, self.key_dim)
        k = k.reshape(num_tokens, self.num_k_heads, self.key_dim)
        v = v.reshape(num_tokens, self.num_v_heads, self.value_dim)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # float32 [num_tokens, Hv]
        o = steps.by_sequence(
            (q, k, v, g, beta),
            lambda *rows: ops.gated_delta_rule_recurrent(*rows[:5], delta_states, rows[5]),
            lambda *rows: ops.gated_delta_rule_chunked(*rows[:5], delta_states, rows[5]),
        )  # [num_tokens, Hv, Dv]
        o = self.norm(o, z.reshape(num_tokens, self.num_v_heads, self.value_dim))
        return self.out_proj(o.reshape(num_tokens, self.value_size))
