"""Model configuration parsed at the edge (config.json or GGUF metadata) into a frozen dataclass."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import CorruptFileError, MissingFileError, ModelLoadError


@dataclass(frozen=True)
class RopeScaling:
    """Rotary-embedding frequency scaling, as HF `rope_scaling` describes it."""

    rope_type: str  # "default", "linear" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    SUPPORTED = ("default", "linear", "llama3")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> RopeScaling | None:
        if not d:
            return None
        rope_type = d.get("rope_type", d.get("type", "default"))
        if rope_type not in cls.SUPPORTED:
            raise ModelLoadError(
                f"rope_scaling type {rope_type!r} is not supported; supported types are "
                f"{', '.join(cls.SUPPORTED)}. Use a checkpoint with one of those."
            )
        if rope_type == "default":
            return None
        return cls(
            rope_type=rope_type,
            factor=float(d.get("factor", 1.0)),
            low_freq_factor=float(d.get("low_freq_factor", 1.0)),
            high_freq_factor=float(d.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(d.get("original_max_position_embeddings", 8192)),
        )


@dataclass(frozen=True)
class ModelConfig:
    """Everything the text model needs to build its layers; unknown keys are ignored."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2 always, Llama optional)
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head of q and k (Qwen3)
    sliding_window: int | None = None  # attend only to the last N positions (Mistral)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    torch_dtype: str | None = None  # the checkpoint's own dtype name, e.g. "bfloat16"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], architecture: str | None = None) -> ModelConfig:
        """Parse a Hugging Face config.json dict; `architecture` overrides `architectures[0]`."""
        if architecture is None:
            archs = d.get("architectures") or []
            if not archs:
                raise ModelLoadError(
                    "config.json has no 'architectures' entry, so the model class is unknown. "
                    'Add e.g. "architectures": ["LlamaForCausalLM"] to config.json.'
                )
            architecture = archs[0]
        # transformers >= 5 writes `rope_parameters` (with rope_theta inside) instead of `rope_scaling`.
        rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            eos = d.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                architecture=architecture,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(d.get("rope_theta") or rope.get("rope_theta") or 10000.0),
                rope_scaling=RopeScaling.from_dict(rope),
                max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                attention_bias=bool(d.get("attention_bias", architecture.startswith("Qwen2"))),
                mlp_bias=bool(d.get("mlp_bias", False)),
                qk_norm=architecture.startswith("Qwen3"),
                sliding_window=_sliding_window(d, architecture),
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=eos_ids,
                pad_token_id=d.get("pad_token_id"),
                torch_dtype=d.get("torch_dtype") or d.get("dtype"),
                extra=d,
            )
        except KeyError as e:
            raise ModelLoadError(
                f"config.json is missing the required key {e.args[0]!r} for {architecture}. "
                "Check that the file is the model's own, complete config.json."
            ) from None
        except (TypeError, ValueError) as e:
            raise CorruptFileError(f"config.json has a value of the wrong type: {e}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(
                f"{path} does not exist. A Hugging Face model folder needs its config.json; "
                "download the complete folder or pass a .gguf file instead."
            )
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CorruptFileError(f"{path} is not valid JSON ({e}). Re-download the file.") from None
        if not isinstance(d, dict):
            raise CorruptFileError(f"{path} does not hold a JSON object. Re-download the file.")
        return cls.from_hf_dict(d)


def _sliding_window(d: dict[str, Any], architecture: str) -> int | None:
    """Mistral applies `sliding_window` on every layer; Qwen2/3 only when `use_sliding_window` is set."""
    window = d.get("sliding_window")
    if architecture.startswith("Qwen") and not d.get("use_sliding_window", False):
        return None
    return int(window) if window else None
