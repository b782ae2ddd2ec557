"""Model configuration parsed at the edge (config.json or GGUF metadata) into a frozen dataclass."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.errors import CorruptFileError, MissingFileError, ModelLoadError, UnsupportedArchitectureError


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
        if rope_type == "mrope":
            rope_type = "default"  # Qwen2-VL's multimodal sections (read by its model) over plain frequencies
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
    # Multimodal checkpoints (config.json with "text_config"): the class of the language model inside, and
    # the vocabulary id of the image placeholder token. None for text-only models.
    text_architecture: str | None = None
    image_token_id: int | None = None
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
        if "text_config" in d or "vision_config" in d or d.get("model_type") in _MULTIMODAL_TYPES:
            return _from_multimodal_dict(cls, d, architecture)
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


# transformers' Qwen2VLTextConfig defaults (Qwen2_5_VLTextConfig's are the same).
_QWEN2_VL_TEXT: dict[str, Any] = dict(
    vocab_size=152064,
    hidden_size=8192,
    intermediate_size=29568,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    max_position_embeddings=32768,
    rms_norm_eps=1e-05,
    # Inside rope_parameters, where transformers 5 writes it: a top-level default would override a saved one.
    rope_parameters={"rope_theta": 1000000.0},
    bos_token_id=151643,
    eos_token_id=151645,
)
# A nested text_config holds only the keys that differ from its transformers config class's defaults
# (llava-1.5 omits hidden_size, num_hidden_layers, ...), so those defaults are part of the format.
# head_dim (num_key_value_heads) is left out where transformers derives it from hidden_size and
# num_attention_heads (num_attention_heads).
_TEXT_DEFAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": (
        "LlamaForCausalLM",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=2048,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    "mistral": (
        "MistralForCausalLM",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=4096 * 32,
            sliding_window=4096,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    "qwen2": (
        "Qwen2ForCausalLM",
        dict(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=22016,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=32768,
        ),
    ),
    "qwen3": (
        "Qwen3ForCausalLM",
        dict(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=22016,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            head_dim=128,
            max_position_embeddings=32768,
        ),
    ),
    # Qwen2-VL / Qwen2.5-VL language models (the M-RoPE sections are read by engine/models/qwen2_vl.py).
    "qwen2_vl_text": ("Qwen2ForCausalLM", _QWEN2_VL_TEXT),
    "qwen2_5_vl_text": ("Qwen2ForCausalLM", _QWEN2_VL_TEXT),
    "gemma3_text": (
        "Gemma3ForCausalLM",
        dict(
            vocab_size=262208,
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            max_position_embeddings=131072,
            sliding_window=4096,
            tie_word_embeddings=True,
            bos_token_id=2,
            eos_token_id=1,
            pad_token_id=0,
        ),
    ),
}
# Wrapper model types whose text_config may be left out entirely (meaning all defaults).
_MULTIMODAL_TYPES = ("llava",)
# Wrapper model types whose released configs keep the text model's keys at the top level, beside vision_config.
_FLAT_TEXT_TYPES = {"qwen2_vl": "qwen2_vl_text", "qwen2_5_vl": "qwen2_5_vl_text"}
# Checkpoint-wide keys that older multimodal configs keep at the top level instead of in text_config.
_SHARED_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype")


def _from_multimodal_dict(cls: type[ModelConfig], d: dict[str, Any], architecture: str) -> ModelConfig:
    """A wrapper config (LLaVA and kin): the text fields come from `text_config`, completed with the defaults
    of its `model_type` (transformers' rule, "llama" when absent); the architecture stays the wrapper's."""
    text = d.get("text_config") or {}
    if "text_config" not in d and d.get("model_type") in _FLAT_TEXT_TYPES:
        text = {k: v for k, v in d.items() if k not in ("vision_config", "architectures")}
        text["model_type"] = _FLAT_TEXT_TYPES[d["model_type"]]
    if not isinstance(text, dict):
        raise CorruptFileError(f"config.json 'text_config' must be an object, got {type(text).__name__}")
    model_type = text.get("model_type", "llama")
    if model_type in _TEXT_DEFAULTS:
        text_architecture, defaults = _TEXT_DEFAULTS[model_type]
    else:
        # Unknown family: keep its own architecture name so the model class can say what is unsupported.
        text_architecture, defaults = (text.get("architectures") or [model_type])[0], {}
    merged = {**defaults, **{k: d[k] for k in _SHARED_KEYS if k in d}, **text}
    try:
        parsed = cls.from_hf_dict(merged, architecture=text_architecture)
    except ModelLoadError:
        if model_type in _TEXT_DEFAULTS:
            raise
        raise UnsupportedArchitectureError(
            f"config.json text_config model_type {model_type!r} (inside {architecture}) is not a supported "
            f"language model family; supported: {', '.join(_TEXT_DEFAULTS)}."
        ) from None
    # transformers ties the wrapper's embeddings when either level asks for it.
    tied = bool(d.get("tie_word_embeddings", False)) or parsed.tie_word_embeddings
    image_token = d.get("image_token_index", d.get("image_token_id"))
    if image_token is not None and (isinstance(image_token, bool) or not isinstance(image_token, int)):
        raise CorruptFileError(f"config.json image_token_index must be a token id (an integer), got {image_token!r}")
    return replace(
        parsed,
        architecture=architecture,
        text_architecture=text_architecture,
        tie_word_embeddings=tied,
        torch_dtype=d.get("torch_dtype") or d.get("dtype") or parsed.torch_dtype,
        image_token_id=None if image_token is None else int(image_token),
        extra=d,
    )


def _sliding_window(d: dict[str, Any], architecture: str) -> int | None:
    """Mistral applies `sliding_window` on every layer; Qwen2/3 only when `use_sliding_window` is set."""
    window = d.get("sliding_window")
    if architecture.startswith("Qwen") and not d.get("use_sliding_window", False):
        return None
    return int(window) if window else None
