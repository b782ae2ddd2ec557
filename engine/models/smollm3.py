"""SmolLM3: Llama's layers, as transformers' SmolLM3ForCausalLM computes them, where some layers use no rotary
at all: their queries and keys go unrotated, so they attend by content alone (NoPE).

    no_rope_layers          one flag per layer, 1 = rotary, 0 = none; when absent, every
                            `no_rope_layer_interval`-th layer (4 by default: layers 3, 7, 11, ...) has none
    use_sliding_window      with `sliding_window`, the layers `layer_types` names "sliding_attention" see only the
                            last `sliding_window` positions (by default the no-rope ones); off in released configs

llama.cpp's smollm3 GGUF files cannot say which layers skip rotary: its runtime fixes every fourth, and
engine/config/gguf.py reads them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config.model import ModelConfig
from engine.errors import CorruptFileError
from engine.models.llama import LlamaForCausalLM

_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class SmolLM3Settings:
    """The SmolLM3 part of a SmolLM3Config: per layer, whether it uses rotary and its sliding window."""

    uses_rope: tuple[bool, ...]
    windows: tuple[int | None, ...]

    @classmethod
    def from_config(cls, config: ModelConfig) -> SmolLM3Settings:
        """transformers' rules (SmolLM3Config.__post_init__); a list of the wrong length or kind is refused, naming
        its key."""
        d, n = config.extra, config.num_hidden_layers
        flags = d.get("no_rope_layers")
        if flags is None:
            interval = d.get("no_rope_layer_interval", 4)
            if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
                raise CorruptFileError(
                    f"config.json 'no_rope_layer_interval' must be a positive whole number, got {interval!r}. "
                    "Fix or re-download the file."
                )
            flags = [int((i + 1) % interval != 0) for i in range(n)]
        if not isinstance(flags, list) or len(flags) != n or any(f not in (0, 1) for f in flags):
            raise CorruptFileError(
                f"config.json 'no_rope_layers' should hold a 1 (rotary) or 0 (none) for each of the {n} layers, "
                f"got {flags!r}. Fix or re-download the file."
            )
        uses_rope = tuple(bool(f) for f in flags)
        types = d.get("layer_types")
        if types is None:  # sliding where there is no rotary, when sliding is on at all
            types = [_LAYER_TYPES[config.sliding_window is not None and not rope] for rope in uses_rope]
        if not isinstance(types, list) or len(types) != n or any(t not in _LAYER_TYPES for t in types):
            raise CorruptFileError(
                f"config.json 'layer_types' should name one of {', '.join(_LAYER_TYPES)} for each of the {n} "
                f"layers, got {types!r}. Fix or re-download the file."
            )
        # config.sliding_window is set only under use_sliding_window (engine/config/model.py)
        windows = tuple(config.sliding_window if t == "sliding_attention" else None for t in types)
        return cls(uses_rope, windows)


class SmolLM3ForCausalLM(LlamaForCausalLM):
    architectures = ("SmolLM3ForCausalLM",)

    def __init__(self, config: ModelConfig, rope_freq_factors: torch.Tensor | None = None):
        settings = SmolLM3Settings.from_config(config)  # before any layer is built
        super().__init__(config, rope_freq_factors)
        self.settings = settings
        for layer, uses_rope, window in zip(self.model.layers, settings.uses_rope, settings.windows):
            layer.self_attn.rotary = uses_rope
            layer.self_attn.sliding_window = window
