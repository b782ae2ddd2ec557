"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3's layers (q/k norms) whose MLP is a sparse
mixture of experts (engine/models/moe.py), except in the layers `mlp_only_layers` names or `decoder_sparse_step`
skips, which keep a dense SwiGLU MLP of `intermediate_size`.

The experts reach the model under three sets of names, all joined here into one [gate | up] and one down weight
per layer:

    released folders (and transformers' save_pretrained)  mlp.experts.{e}.gate_proj.weight [I, H], up, down
    transformers' own 3-D parameters                       mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]
    GGUF files (engine/gguf/names.py)                      mlp.experts.gate_proj.weight [E, I, H], up, down:
                                                           3-D float tensors, or their rows of blocks
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.config.families import TEXT_FAMILIES
from engine.config.model import ModelConfig
from engine.errors import CorruptFileError, ModelLoadError, TensorMismatchError
from engine.memory import release_freed_memory
from engine.models.llama import LlamaForCausalLM
from engine.models.moe import ExpertPart, SparseMoE

_MAX_EXPERTS = 4096  # far past any released model's (128 here; 512 in the largest MoE families)


@dataclass(frozen=True)
class Qwen3MoeSettings:
    """The mixture-of-experts part of a Qwen3MoeConfig, parsed from its dict."""

    num_experts: int
    top_k: int  # experts per token
    expert_size: int  # each expert's intermediate size
    norm_topk_prob: bool  # renormalise the top-k probabilities to sum to 1
    is_sparse: tuple[bool, ...]  # per layer

    @classmethod
    def from_config(cls, config: ModelConfig) -> Qwen3MoeSettings:
        """Absent optional keys take transformers' defaults (engine/config/families.py); the expert counts and
        size fix tensor shapes, so a config without them is refused, naming the key."""
        d = {**TEXT_FAMILIES["qwen3_moe"].defaults, **config.extra}
        num_experts = _count(d, ("num_experts", "num_local_experts"), _MAX_EXPERTS)
        top_k = _count(d, ("num_experts_per_tok",), num_experts)
        expert_size = _count(d, ("moe_intermediate_size",), 1 << 20)
        step = _count(d, ("decoder_sparse_step",), 1 << 20)
        dense = d.get("mlp_only_layers") or []
        if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
            raise CorruptFileError(f"config.json 'mlp_only_layers' must be a list of layer numbers, got {dense!r}.")
        is_sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(config.num_hidden_layers))
        return cls(num_experts, top_k, expert_size, bool(d.get("norm_topk_prob")), is_sparse)


def _count(d: dict[str, Any], keys: tuple[str, ...], most: int) -> int:
    """A whole number in 1..`most` under the first of `keys` present."""
    key = next((k for k in keys if d.get(k) is not None), None)
    if key is None:
        raise ModelLoadError(
            f"the model config lacks {keys[0]!r}, which a Qwen3MoeForCausalLM must give (its experts' shape and "
            "routing depend on it). Use the model's own, complete config.json."
        )
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
        raise CorruptFileError(
            f"the model config's {key!r} is {value!r}, but must be a whole number from 1 to {most}. "
            "The file is damaged or not this model's; download it again."
        )
    return value


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    architectures = ("Qwen3MoeForCausalLM",)

    def __init__(self, config: ModelConfig, rope_freq_factors: torch.Tensor | None = None):
        moe = Qwen3MoeSettings.from_config(config)  # before any layer is built
        super().__init__(config, rope_freq_factors)
        self.moe = moe
        for layer, is_sparse in zip(self.model.layers, moe.is_sparse):
            if is_sparse:  # Llama's layer, its dense MLP swapped for the experts
                layer.mlp = SparseMoE(
                    config.hidden_size, moe.num_experts, moe.top_k, moe.expert_size, moe.norm_topk_prob
                )

    def load_tensors(self, tensors: dict[str, Any]) -> None:
        """The experts first (out of `tensors`, layer by layer, so their checkpoint copies go as they are
        joined), then everything else as every model loads it."""
        for i, layer in enumerate(self.model.layers):
            if isinstance(layer.mlp, SparseMoE):
                prefix = f"model.layers.{i}.mlp.experts"
                gate_up, down = self._take_experts(tensors, prefix)
                layer.mlp.experts_gate_up.load(gate_up, prefix)
                layer.mlp.experts_down.load(down, prefix)
                del gate_up, down
                release_freed_memory()
        super().load_tensors(tensors)

    def _take_experts(self, tensors: dict[str, Any], prefix: str) -> tuple[list[ExpertPart], list[ExpertPart]]:
        """([gate | up] parts, [down]) of one layer's experts, removed from `tensors`."""
        if f"{prefix}.gate_up_proj" in tensors:  # transformers' 3-D parameters
            return [tensors.pop(f"{prefix}.gate_up_proj")], [_pop(tensors, f"{prefix}.down_proj")]
        if f"{prefix}.gate_proj.weight" in tensors:  # a GGUF file's: one 3-D tensor (or its blocks) each
            gate, up = _pop(tensors, f"{prefix}.gate_proj.weight"), _pop(tensors, f"{prefix}.up_proj.weight")
            return [gate, up], [_pop(tensors, f"{prefix}.down_proj.weight")]
        hidden, size = self.config.hidden_size, self.moe.expert_size
        return (
            [self._stack(tensors, prefix, ("gate_proj", "up_proj"), (size, hidden))],
            [self._stack(tensors, prefix, ("down_proj",), (hidden, size))],
        )

    def _stack(self, tensors: dict[str, Any], prefix: str, projections: tuple[str, ...], shape) -> torch.Tensor:
        """Per-expert matrices [rows, cols] (each of `projections`, stacked on rows) as one [E, rows * n, cols],
        filled one matrix at a time so the load holds one extra matrix, not a second copy of the layer."""
        out = None
        for e in range(self.moe.num_experts):
            for j, projection in enumerate(projections):
                name = f"{prefix}.{e}.{projection}.weight"
                matrix = _pop(tensors, name)
                if tuple(matrix.shape) != shape:
                    raise TensorMismatchError(
                        f"tensor {name!r} has shape {tuple(matrix.shape)} but the config implies {shape}. "
                        "config.json and the weights do not belong together."
                    )
                if out is None:  # [E, rows * len(projections), cols]
                    out = matrix.new_empty(self.moe.num_experts, shape[0] * len(projections), shape[1])
                out[e, j * shape[0] : (j + 1) * shape[0]] = matrix
        return out


def _pop(tensors: dict[str, Any], name: str) -> ExpertPart:
    if name not in tensors:
        raise TensorMismatchError(
            f"the checkpoint has no tensor {name!r} (needed for Qwen3MoeForCausalLM). "
            "The checkpoint is incomplete or is not of this architecture."
        )
    return tensors.pop(name)
