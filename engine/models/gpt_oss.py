"""gpt-oss (gpt-oss-20b, gpt-oss-120b): Llama's pre-norm layers with three changes, as transformers'
GptOssForCausalLM computes them:

    attention  q/k/v/o with biases, YaRN rope, layers alternating a sliding window (`layer_types`, even layers
               by default) and full attention, and a learned sink logit per query head in every softmax
               (kernels.ops.paged_attention_sinks)
    MLP        a mixture of experts (engine/models/moe.py) whose router has a bias and takes the softmax over
               the top-k logits only, and whose experts have biases and a clamped SwiGLU:
               out = (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g),  g = clamp(gate, max=limit)

The experts reach the model under three sets of names, all joined here into one [gate | up] and one down weight
(and bias) per layer:

    transformers' float parameters  mlp.experts.gate_up_proj [E, H, 2I] (x @ W; gate and up columns interleaved,
                                    gate first), gate_up_proj_bias [E, 2I], down_proj [E, I, H], down_proj_bias
    released (MXFP4) folders        mlp.experts.gate_up_proj_blocks [E, 2I, H / 32, 16] + _scales [E, 2I, H / 32]
                                    (rows interleaved the same way), down_proj_blocks/_scales: kept in their
                                    blocks where a kernel reads them (kernels/torch_ref/mxfp4.py)
    GGUF files (engine/gguf/names.py)  mlp.experts.{gate,up,down}_proj.weight [E, rows, cols] and .bias [E, rows],
                                    llama.cpp's split of the same tensors
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from engine.config.families import TEXT_FAMILIES
from engine.config.model import ModelConfig
from engine.errors import CorruptFileError, ModelLoadError, TensorMismatchError
from engine.memory import release_freed_memory
from engine.models.batch import Batch
from engine.models.layers import Attention
from engine.models.linear import BlockWeight
from engine.models.llama import LlamaForCausalLM
from engine.models.moe import ExpertPart, SparseMoE
from kernels import ops
from kernels.torch_ref import mxfp4

_MAX_EXPERTS = 4096
_LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class GptOssSettings:
    """The gpt-oss part of a GptOssConfig, parsed from its dict."""

    num_experts: int
    top_k: int
    sliding_window: int | None
    is_sliding: tuple[bool, ...]  # per layer
    swiglu_limit: float
    swiglu_alpha: float

    @classmethod
    def from_config(cls, config: ModelConfig) -> GptOssSettings:
        """Absent optional keys take transformers' defaults (engine/config/families.py); the expert counts fix
        tensor shapes and routing, so a config without them is refused, naming the key (OpenAI's own spelling,
        `num_experts` / `experts_per_token`, is read too)."""
        d = {**TEXT_FAMILIES["gpt_oss"].defaults, **config.extra}
        num_experts = _count(d, ("num_local_experts", "num_experts"), _MAX_EXPERTS)
        top_k = _count(d, ("num_experts_per_tok", "experts_per_token"), num_experts)
        n = config.num_hidden_layers
        types = d.get("layer_types")
        if types is None:  # transformers' default: sliding, full, sliding, ...
            types = [_LAYER_TYPES[i % 2] for i in range(n)]
        if not isinstance(types, list) or len(types) != n or any(t not in _LAYER_TYPES for t in types):
            raise CorruptFileError(
                f"config.json layer_types should list one of {', '.join(_LAYER_TYPES)} for each of the {n} layers, "
                f"got {types!r}. Fix or re-download the file."
            )
        window = d.get("sliding_window")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise CorruptFileError(f"config.json 'sliding_window' must be a positive whole number, got {window!r}.")
        is_sliding = tuple(bool(window) and t == "sliding_attention" for t in types)
        limit, alpha = d.get("swiglu_limit"), d.get("swiglu_alpha")
        for key, value in (("swiglu_limit", limit), ("swiglu_alpha", alpha)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise CorruptFileError(f"config.json {key!r} must be a positive number, got {value!r}.")
        return cls(num_experts, top_k, window or None, is_sliding, float(limit), float(alpha))


def _count(d: dict[str, Any], keys: tuple[str, ...], most: int) -> int:
    """A whole number in 1..`most` under the first of `keys` present."""
    key = next((k for k in keys if d.get(k) is not None), None)
    if key is None:
        raise ModelLoadError(
            f"the model config lacks {keys[0]!r} (or {keys[1]!r}), which a GptOssForCausalLM must give (its "
            "experts' shape and routing depend on it). Use the model's own, complete config.json."
        )
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
        raise CorruptFileError(
            f"the model config's {key!r} is {value!r}, but must be a whole number from 1 to {most}. "
            "The file is damaged or not this model's; download it again."
        )
    return value


class SinkAttention(Attention):
    """Grouped-query attention whose softmax also counts a learned logit per query head (`sinks`)."""

    def __init__(self, config: ModelConfig, layer_idx: int, sliding_window: int | None):
        super().__init__(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            qkv_bias=config.attention_bias,
            o_bias=config.attention_bias,
            qk_norm_eps=None,
            sliding_window=sliding_window,
            layer_idx=layer_idx,
        )
        self.sinks = nn.Parameter(torch.zeros(config.num_attention_heads))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: Batch) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q = qkv[:, :q_size].view(-1, self.num_heads, self.head_dim)  # [num_tokens, Hq, D]
        k = qkv[:, q_size : q_size + kv_size].view(-1, self.num_kv_heads, self.head_dim)
        v = qkv[:, q_size + kv_size :].view(-1, self.num_kv_heads, self.head_dim)
        q = ops.apply_rope(q, cos, sin)
        k = ops.apply_rope(k, cos, sin)
        k_cache, v_cache = batch.cache.k[self.layer_idx], batch.cache.v[self.layer_idx]
        tables, slots, runs = batch.pages_of(self.layer_idx)
        ops.write_kv(k_cache, v_cache, k, v, slots)
        o = ops.paged_attention_sinks(
            q,
            k_cache,
            v_cache,
            tables,
            batch.seq_lens,
            batch.query_lens,
            batch.seq_lens_host,
            self.scale,
            self.sinks.float(),
            self.sliding_window,
            runs,
        )
        return self.o_proj(o.reshape(-1, q_size).to(x.dtype))


class GptOssMoE(SparseMoE):
    """The router (biased, softmax over the top-k logits) and experts with gpt-oss's clamped SwiGLU."""

    def __init__(self, config: ModelConfig, settings: GptOssSettings):
        super().__init__(
            config.hidden_size,
            settings.num_experts,
            settings.top_k,
            config.intermediate_size,
            norm_topk_prob=False,
            router_bias=True,
            softmax_after_topk=True,
        )
        self.limit, self.alpha = settings.swiglu_limit, settings.swiglu_alpha

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(-self.limit, self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


class GptOssForCausalLM(LlamaForCausalLM):
    architectures = ("GptOssForCausalLM",)

    def __init__(self, config: ModelConfig, rope_freq_factors: torch.Tensor | None = None):
        settings = GptOssSettings.from_config(config)  # before any layer is built
        super().__init__(config, rope_freq_factors)
        self.settings = settings
        for i, layer in enumerate(self.model.layers):  # Llama's layers, attention and MLP swapped
            layer.self_attn = SinkAttention(config, i, settings.sliding_window if settings.is_sliding[i] else None)
            layer.mlp = GptOssMoE(config, settings)

    def checkpoint_names(self, name: str) -> tuple[str, ...]:
        if ".mlp.gate." in name:  # our router is SparseMoE's `gate`
            return (name.replace(".mlp.gate.", ".mlp.router."),)
        return super().checkpoint_names(name)

    def load_tensors(self, tensors: dict[str, Any]) -> None:
        """The experts first (out of `tensors`, layer by layer, so their checkpoint copies go as they are
        joined), then everything else as every model loads it."""
        for name in [n for n in tensors if n.endswith(".self_attn.sinks.weight")]:  # a GGUF file's name
            tensors[name.removesuffix(".weight")] = tensors.pop(name)
        dtype = getattr(tensors.get("model.embed_tokens.weight"), "dtype", torch.float32)
        for i, layer in enumerate(self.model.layers):
            prefix = f"model.layers.{i}.mlp.experts"
            (gate_up, gate_up_bias), (down, down_bias) = _take_experts(tensors, prefix, dtype)
            layer.mlp.experts_gate_up.load(gate_up, prefix)
            layer.mlp.experts_gate_up.load_bias([b.to(dtype) for b in gate_up_bias], prefix)
            layer.mlp.experts_down.load(down, prefix)
            layer.mlp.experts_down.load_bias([b.to(dtype) for b in down_bias], prefix)
            del gate_up, down
            release_freed_memory()
        super().load_tensors(tensors)


Parts = tuple[list[ExpertPart], list[torch.Tensor]]  # weights and biases, stacked on the output dimension


def _take_experts(tensors: dict[str, Any], prefix: str, dtype: torch.dtype) -> tuple[Parts, Parts]:
    """(([gate, up] weights, [gate, up] biases), ([down], [down bias])) of one layer, removed from `tensors`."""
    if f"{prefix}.gate_proj.weight" in tensors:  # a GGUF file's: already split and [E, rows, cols]
        gate, up, down = (_pop(tensors, f"{prefix}.{p}_proj.weight") for p in ("gate", "up", "down"))
        biases = [_pop(tensors, f"{prefix}.{p}_proj.bias") for p in ("gate", "up", "down")]
        return ([gate, up], biases[:2]), ([down], biases[2:])
    bias = _pop(tensors, f"{prefix}.gate_up_proj_bias")
    biases = [bias[:, 0::2], bias[:, 1::2]]
    down_bias = [_pop(tensors, f"{prefix}.down_proj_bias")]
    if f"{prefix}.gate_up_proj_blocks" in tensors:  # MXFP4: rows [E, out, blocks]
        rows = _mxfp4(tensors, f"{prefix}.gate_up_proj")
        gate, up = (_block_weight(rows[:, j::2], dtype) for j in (0, 1))
        return ([gate, up], biases), ([_block_weight(_mxfp4(tensors, f"{prefix}.down_proj"), dtype)], down_bias)
    gate_up = _pop(tensors, f"{prefix}.gate_up_proj").transpose(1, 2)  # [E, 2I, H]
    down = _pop(tensors, f"{prefix}.down_proj").transpose(1, 2).contiguous()  # [E, H, I]
    return ([gate_up[:, 0::2].contiguous(), gate_up[:, 1::2].contiguous()], biases), ([down], down_bias)


def _mxfp4(tensors: dict[str, Any], name: str) -> torch.Tensor:
    """A `_blocks`/`_scales` pair as GGUF MXFP4 rows [E, out_features, row bytes]."""
    blocks, scales = _pop(tensors, f"{name}_blocks"), _pop(tensors, f"{name}_scales")
    try:
        return mxfp4.from_hf(blocks, scales).flatten(2)
    except ValueError as e:
        raise TensorMismatchError(
            f"{name}_blocks / _scales: {e}. The checkpoint is damaged; download it again."
        ) from None


def _block_weight(rows: torch.Tensor, dtype: torch.dtype) -> BlockWeight:
    """Rows [E, n, row bytes] of MXFP4 blocks as one weight of E * n rows, in the layout its kernel reads where
    one does (`Experts.load` expands it to float otherwise)."""
    weight = BlockWeight([(rows.reshape(-1, rows.shape[-1]).contiguous(), "MXFP4")], rows.shape[-1] // 17 * 32, dtype)
    return weight.packed() if weight.is_packable() else weight


def _pop(tensors: dict[str, Any], name: str) -> Any:
    if name not in tensors:
        raise TensorMismatchError(
            f"the checkpoint has no tensor {name!r} (needed for GptOssForCausalLM). "
            "The checkpoint is incomplete or is not of this architecture."
        )
    return tensors.pop(name)
