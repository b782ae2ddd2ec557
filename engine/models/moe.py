"""A sparse mixture-of-experts MLP: a router picks `top_k` of `num_experts` SwiGLU experts per token, and the
token's output is their outputs weighted by the router's probabilities.

Routing is per token and no token is ever dropped (no expert capacity), so a token's output depends on that
token alone: a job's tokens are the same alone and in any batch. A step's tokens are grouped by expert (one
argsort of the routed expert ids), and each expert that got tokens multiplies just those rows:

    token rows x [T, H] --router--> top-k (expert id, weight) per token, T * k pairs
    pairs sorted by expert:   e0: rows 2 5 | e3: rows 0 2 7 | e4: row 5 | ...
    per expert e with rows r: y = down_e(silu(gate_e(x[r])) * up_e(x[r])) * weight;  out[r] += y

Each projection keeps every expert's weight in one tensor (`Experts`): a float [E, N, K], or rows of GGUF blocks
laid out expert by expert, of which an expert's matmul reads its own slice (a view). A decode step so reads
only the routed experts' weights, as llama.cpp's `mul_mat_id` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import TensorMismatchError
from engine.models.linear import BlockWeight, Linear, QuantizedWeight, SplitWeight
from kernels import ops

ExpertPart = torch.Tensor | BlockWeight | QuantizedWeight | SplitWeight


class Experts(nn.Module):
    """One projection of all experts: `num_experts` weights [out_features, in_features], multiplied one expert at
    a time.

    Float weights are the buffer `weight` [E, N, K]. Weights kept in GGUF blocks are buffers blocks0, blocks1, ...
    (one per run of parts of one type, `block_types`), each [E * rows_i, row bytes] with expert e's rows at
    [e * rows_i, (e + 1) * rows_i): a tensor row is a weight row, or 16 of them in the CPU's repacked tiles,
    which never straddle two experts as every expert has whole groups of 16 rows (the loader checks).

    Experts with biases (gpt-oss) hold them in the buffer `bias` [E, out_features] (`load_bias`); None without."""

    def __init__(self, num_experts: int, in_features: int, out_features: int):
        super().__init__()
        self.num_experts, self.in_features, self.out_features = num_experts, in_features, out_features
        self.register_buffer("weight", torch.empty(num_experts, out_features, in_features))  # [E, N, K]
        self.register_buffer("bias", None)
        self.block_types: list[str] = []

    def load(self, parts: Sequence[ExpertPart], name: str) -> None:
        """Fill from checkpoint parts stacked on the output dimension within each expert (gate, then up): each a
        float [E, n_i, K] or a packed weight of E * n_i rows, expert by expert. Blocks a kernel reads stay in
        their blocks, neighbours of one type joined expert by expert (then an expert is one kernel call);
        anything else is expanded to float. `name` is for messages."""
        rows = sum(_num_rows(p) for p in parts)
        cols = {int(p.shape[-1]) for p in parts}
        if rows != self.num_experts * self.out_features or cols != {self.in_features}:
            raise TensorMismatchError(
                f"the experts of {name} hold {rows} rows of {sorted(cols)} columns, but the config implies "
                f"{self.num_experts} experts of [{self.out_features}, {self.in_features}]. config.json (or the GGUF "
                "metadata) and the weights do not belong together."
            )
        if all(isinstance(p, BlockWeight) and self._keeps(p) for p in parts):
            self._load_blocks(parts)
        else:
            self.weight = torch.cat([self._as_float(p) for p in parts], dim=1)

    def load_bias(self, parts: Sequence[torch.Tensor], name: str) -> None:
        """Fill the biases from parts [E, n_i] stacked on the output dimension as `load`'s weights are."""
        shapes = [tuple(p.shape) for p in parts]
        if (
            any(len(s) != 2 or s[0] != self.num_experts for s in shapes)
            or sum(s[1] for s in shapes) != self.out_features
        ):
            raise TensorMismatchError(
                f"the expert biases of {name} have shapes {shapes}, but the config implies {self.num_experts} "
                f"experts of {self.out_features} outputs. config.json (or the GGUF metadata) and the weights do not "
                "belong together."
            )
        self.bias = torch.cat(list(parts), dim=1)

    def _keeps(self, weight: BlockWeight) -> bool:
        """Whether `weight` can stay in blocks: one part whose tensor rows split evenly into the experts."""
        return len(weight.parts) == 1 and weight.parts[0][0].shape[0] % self.num_experts == 0 and weight.is_packable()

    def _load_blocks(self, parts: Sequence[BlockWeight]) -> None:
        runs: list[tuple[list[torch.Tensor], str]] = []
        for blocks, type_name in (p.parts[0] for p in parts):
            if runs and runs[-1][1] == type_name:
                runs[-1][0].append(blocks)
            else:
                runs.append(([blocks], type_name))
        self.weight = None
        for i, (run, _) in enumerate(runs):
            width = run[0].shape[1]
            # expert by expert: [E, rows_a, bytes] beside [E, rows_b, bytes] -> [E * (rows_a + rows_b), bytes]
            joined = run[0] if len(run) == 1 else torch.cat([b.view(self.num_experts, -1, width) for b in run], 1)
            self.register_buffer(f"blocks{i}", joined.reshape(-1, width).contiguous())
        self.block_types = [t for _, t in runs]

    def _as_float(self, part: ExpertPart) -> torch.Tensor:
        values = part if isinstance(part, torch.Tensor) else part.dequantize()
        return values.reshape(self.num_experts, -1, self.in_features)

    def forward(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        """x [rows, in_features] @ W[expert].T (+ bias[expert]) -> [rows, out_features]."""
        bias = None if self.bias is None else self.bias[expert]
        if not self.block_types:
            return F.linear(x, self.weight[expert], bias)
        outs = []
        for i, type_name in enumerate(self.block_types):
            blocks = getattr(self, f"blocks{i}")
            per_expert = blocks.shape[0] // self.num_experts
            outs.append(ops.linear_blocks(x, blocks[expert * per_expert : (expert + 1) * per_expert], type_name))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return out if bias is None else out + bias

    def extra_repr(self) -> str:
        kind = f"GGUF blocks {'+'.join(self.block_types)}" if self.block_types else "float"
        biased = ", bias" if self.bias is not None else ""
        return f"num_experts={self.num_experts}, in={self.in_features}, out={self.out_features}, {kind}{biased}"


def _num_rows(part: ExpertPart) -> int:
    shape = tuple(part.shape)
    return shape[0] * shape[1] if len(shape) == 3 else shape[0]


class SparseMoE(nn.Module):
    """Router (`gate`, hidden -> num_experts, with a bias when `router_bias`) and SwiGLU experts of `expert_size`
    (with biases where the loader gives them: `Experts.load_bias`), no shared expert.

    By default the router's probabilities are a softmax over all experts in float32, the top `top_k` of them
    renormalised to sum to 1 when `norm_topk_prob`. With `softmax_after_topk` (gpt-oss) the top `top_k` logits
    are picked first and the softmax runs over those alone (so they always sum to 1). Either way the weights are
    rounded to the activations' dtype before they weight the experts' outputs."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        expert_size: int,
        norm_topk_prob: bool,
        router_bias: bool = False,
        softmax_after_topk: bool = False,
    ):
        super().__init__()
        self.num_experts, self.top_k, self.norm_topk_prob = num_experts, top_k, norm_topk_prob
        self.softmax_after_topk = softmax_after_topk
        self.gate = Linear(hidden_size, num_experts, bias=router_bias)
        self.experts_gate_up = Experts(num_experts, hidden_size, 2 * expert_size)  # gate rows, then up rows
        self.experts_down = Experts(num_experts, expert_size, hidden_size)

    def route(self, x: torch.Tensor, logits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, top_k] in x's dtype, expert ids [T, top_k] ascending) per token. `logits`: the router's
        float32 logits of x where the caller has them (a recorded decode step keeps the router in float32)."""
        logits = self._router_logits(x) if logits is None else logits
        if self.softmax_after_topk:
            logits, expert_ids = torch.topk(logits, self.top_k, dim=-1)
            weights = torch.softmax(logits, dim=-1)
        else:
            weights, expert_ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
            if self.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        # Ascending ids: a token's experts are then summed in one fixed order, whatever the batch (see forward).
        expert_ids, by_id = torch.sort(expert_ids, dim=-1)
        return weights.gather(-1, by_id).to(x.dtype), expert_ids

    def _router_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The router's logits [T, num_experts] in float32. A float router multiplies in float32, as llama.cpp
        does (GGUF files keep it in F32): the picks then rest on the exact scores, and on CPUs without bfloat16
        instructions a bfloat16 matmul of this shape ran ten times slower than the float32 one."""
        gate = self.gate
        if gate.is_quantized:
            return gate(x).float()
        bias = None if gate.bias is None else gate.bias.float()
        return F.linear(x.float(), gate.weight.float(), bias)

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The experts' gated activation over their [gate | up] rows."""
        return ops.silu_and_mul(gate_up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = self.route(x)
        num_tokens, top_k = expert_ids.shape
        flat = expert_ids.reshape(-1)  # [T * top_k], token-major
        order = torch.argsort(flat, stable=True)  # pairs grouped by expert, tokens ascending within each
        # The layer's one host sync: how many rows each expert got, to slice them (a few dozen ints).
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        rows = x[order // top_k]  # every pair's token row, expert by expert: one gather, then slices
        outs = []
        start = 0
        for expert, count in enumerate(counts):
            if count:
                part = rows[start : start + count]
                outs.append(self.experts_down(self.activate(self.experts_gate_up(part, expert)), expert))
                start += count
        weighted = torch.cat(outs) * weights.reshape(-1)[order, None]
        pairs = torch.empty_like(weighted)
        pairs[order] = weighted  # back to token-major: token t's top_k outputs at [t * top_k, (t + 1) * top_k)
        pairs = pairs.view(num_tokens, top_k, -1)
        # A token's outputs are added in ascending expert id order (route sorts them), one rounding per addition,
        # so its sum never depends on the batch.
        out = pairs[:, 0]
        for k in range(1, top_k):
            out = out + pairs[:, k]
        return out
