"""Model configuration parsed at the edge (config.json or GGUF metadata) into a frozen dataclass.

Released config.json files leave out every key whose value is the default of their transformers config class
(llava-1.5's text_config names little more than its model_type; Gemma 3's gives no head counts). Those
defaults are part of the format, so they are tabled here per family (`_TEXT_FAMILIES`) and per wrapper
(`_WRAPPERS`, which also says what a left-out text_config means and how the wrapper ties its head).
"""

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
    def from_dict(cls, d: dict[str, Any] | None, max_position_embeddings: int = 8192) -> RopeScaling | None:
        """Parse `rope_scaling` / `rope_parameters`; llama3's original context defaults to
        `max_position_embeddings`, as transformers fills it in."""
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
            original_max_position_embeddings=int(d.get("original_max_position_embeddings") or max_position_embeddings),
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
        """Parse a Hugging Face config.json dict; `architecture` overrides `architectures[0]`.

        Keys the dict leaves out take the defaults of its `model_type`'s transformers config class, except that
        a text-only config must give its shape (`_SHAPE_KEYS`); a vision-language one is read by its wrapper's
        rules (`_WRAPPERS`)."""
        if architecture is None:
            archs = d.get("architectures") or []
            if not archs:
                raise ModelLoadError(
                    "config.json has no 'architectures' entry, so the model class is unknown. "
                    'Add e.g. "architectures": ["LlamaForCausalLM"] to config.json.'
                )
            architecture = archs[0]
        if "text_config" in d or "vision_config" in d or _wrapper_type(d, architecture) is not None:
            return _from_multimodal_dict(cls, d, architecture)
        family = _TEXT_FAMILIES.get(d.get("model_type"))
        default_theta = 10000.0
        if family is not None:
            # transformers writes every shape key of a top-level config (only nested sub-configs leave out those
            # equal to their class defaults), so a missing one means a damaged file: it stays an error here.
            d = {**{k: v for k, v in family.defaults.items() if k not in _SHAPE_KEYS}, **d}
            default_theta = family.default_theta
        # transformers >= 5 writes `rope_parameters` (with rope_theta inside) instead of `rope_scaling`.
        rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
        try:
            hidden = _size(d, "hidden_size")
            heads = _size(d, "num_attention_heads")
            max_positions = _size(d, "max_position_embeddings", 2048)
            eos = d.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
            config = cls(
                architecture=architecture,
                vocab_size=_size(d, "vocab_size"),
                hidden_size=hidden,
                intermediate_size=_size(d, "intermediate_size"),
                num_hidden_layers=_size(d, "num_hidden_layers"),
                num_attention_heads=heads,
                num_key_value_heads=_size(d, "num_key_value_heads", heads),
                head_dim=_size(d, "head_dim", hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                # transformers' order: the rope dict's own theta, then the flat key, then the family's default.
                rope_theta=float(rope.get("rope_theta") or d.get("rope_theta") or default_theta),
                rope_scaling=RopeScaling.from_dict(rope, max_positions),
                max_position_embeddings=max_positions,
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
        except (TypeError, ValueError, AttributeError) as e:
            raise CorruptFileError(f"config.json has a value of the wrong type: {e}") from None
        _check_sizes(config)
        return config

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
        try:
            return cls.from_hf_dict(d)
        except ModelLoadError as e:  # name the file: several configs can be involved (a model, its draft)
            named = type(e)(f"{path}: {e}")
            named.__dict__.update(e.__dict__)  # UnsupportedArchitectureError's architecture
            raise named from None


# Bounds on a config's sizes, checked before any module is built: a typo or a hostile file (num_hidden_layers
# 1e9) must give an error, not allocate until memory runs out. Each is far past any released model's.
_BOUNDS = {
    "vocab_size": 4_194_304,
    "hidden_size": 65_536,
    "intermediate_size": 1_048_576,
    "num_hidden_layers": 1_024,
    "num_attention_heads": 1_024,
    "num_key_value_heads": 1_024,
    "head_dim": 4_096,
    "max_position_embeddings": 1 << 26,
}


def _size(d: dict[str, Any], key: str, default: int | None = None) -> int:
    """A positive whole number from config.json (1.0 is 1; 96.7, "12", true and 0 are errors naming `key`)."""
    value = d.get(key) if default is None else (d.get(key) or default)
    if value is None:
        raise KeyError(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise CorruptFileError(
            f"config.json field {key!r} must be a whole number, got {value!r}. Fix or re-download it."
        )
    if not 0 < int(value) <= _BOUNDS.get(key, 1 << 62):
        raise CorruptFileError(
            f"config.json field {key!r} is {value!r}, outside 1..{_BOUNDS.get(key, 1 << 62):,}. "
            "The file is damaged or not a model's config; re-download it."
        )
    return int(value)


def _check_sizes(config: ModelConfig) -> None:
    """The relations between sizes the layers rely on, and token ids inside the vocabulary."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % kv_heads:
        raise CorruptFileError(
            f"config.json: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads}), "
            "so the attention heads cannot be grouped. The file is damaged; re-download it."
        )
    for field_name, ids in (("eos_token_id", config.eos_token_ids), ("bos_token_id", (config.bos_token_id,))):
        for token in ids:
            if token is None:
                continue
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < config.vocab_size:
                raise CorruptFileError(
                    f"config.json field {field_name!r} is {token!r}, but token ids run from 0 to "
                    f"{config.vocab_size - 1} (vocab_size {config.vocab_size}). Fix or re-download the file."
                )


@dataclass(frozen=True)
class _TextFamily:
    """A text model_type: our class for it, and its transformers config class's defaults (config.json keys).

    head_dim (num_key_value_heads) is left out where transformers derives it from hidden_size and
    num_attention_heads (num_attention_heads); `default_theta` is the rope base when no key gives one."""

    architecture: str
    defaults: dict[str, Any]
    default_theta: float = 10000.0


# Qwen2VLTextConfig's defaults (Qwen2_5_VLTextConfig's are the same).
_QWEN2_VL_TEXT = _TextFamily(
    "Qwen2ForCausalLM",
    dict(
        vocab_size=152064,
        hidden_size=8192,
        intermediate_size=29568,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        rms_norm_eps=1e-05,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    default_theta=1_000_000.0,
)
_TEXT_FAMILIES: dict[str, _TextFamily] = {
    "llama": _TextFamily(
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
    "mistral": _TextFamily(
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
    "qwen2": _TextFamily(
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
    "qwen3": _TextFamily(
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
    "qwen2_vl_text": _QWEN2_VL_TEXT,
    "qwen2_5_vl_text": _QWEN2_VL_TEXT,
    # The Gemma-only keys (query_pre_attn_scalar, layer types, per-type rope) are read by engine/models/gemma3.py.
    "gemma3_text": _TextFamily(
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
        default_theta=1_000_000.0,
    ),
}


@dataclass(frozen=True)
class _Wrapper:
    """How a vision-language config (model_type) holds its text model, as its transformers config class does.

    `text_type`: the text model_type when text_config names none (one naming another family is refused by
    Gemma 3 and Qwen2-VL, whose transformers classes would read it as their own); `absent_text`: what
    transformers builds when text_config is left out, over `text_type`'s defaults; `flat_text`: released
    configs keep the text keys at the top level; `tie`: the default of the wrapper's own tie_word_embeddings,
    which decides the tie; `tie_follows_text`: a text_config that ties makes the wrapper tie too.
    """

    architectures: tuple[str, ...]
    text_type: str
    absent_text: dict[str, Any] = field(default_factory=dict)
    flat_text: bool = False
    tie: bool = False
    tie_follows_text: bool = False


_WRAPPERS: dict[str, _Wrapper] = {
    "llava": _Wrapper(("LlavaForConditionalGeneration",), "llama", tie_follows_text=True),
    "gemma3": _Wrapper(("Gemma3ForConditionalGeneration",), "gemma3_text", tie=True),
    "idefics3": _Wrapper(("Idefics3ForConditionalGeneration",), "llama", absent_text={"rms_norm_eps": 1e-5}),
    "smolvlm": _Wrapper(("SmolVLMForConditionalGeneration",), "llama", absent_text={"rms_norm_eps": 1e-5}),
    "mistral3": _Wrapper(
        ("Mistral3ForConditionalGeneration",),
        "mistral",
        # Mistral Small 3.1's text model.
        absent_text=dict(
            head_dim=128,
            hidden_size=5120,
            intermediate_size=32768,
            max_position_embeddings=131072,
            num_attention_heads=32,
            num_hidden_layers=40,
            num_key_value_heads=8,
            rms_norm_eps=1e-05,
            rope_theta=1000000000.0,
            sliding_window=None,
            vocab_size=131072,
        ),
        tie=True,
    ),
    "qwen2_vl": _Wrapper(
        ("Qwen2VLForConditionalGeneration",),
        "qwen2_vl_text",
        flat_text=True,
        tie_follows_text=True,
    ),
    "qwen2_5_vl": _Wrapper(
        ("Qwen2_5_VLForConditionalGeneration",),
        "qwen2_5_vl_text",
        flat_text=True,
        tie_follows_text=True,
    ),
}
# The keys that fix a text model's tensor shapes.
_SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Checkpoint-wide keys that older multimodal configs keep at the top level instead of in text_config.
_SHARED_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype")


def _wrapper_type(d: dict[str, Any], architecture: str) -> str | None:
    """The vision-language model_type of a config: its own, or the one its architecture belongs to."""
    if d.get("model_type") in _WRAPPERS:
        return d["model_type"]
    return next((name for name, w in _WRAPPERS.items() if architecture in w.architectures), None)


def _from_multimodal_dict(cls: type[ModelConfig], d: dict[str, Any], architecture: str) -> ModelConfig:
    """A wrapper config (LLaVA and kin): the text fields come from `text_config`, completed with the defaults
    of its text family (as the wrapper's transformers config class picks it); the architecture stays the
    wrapper's. A wrapper Tandem does not know is read the LLaVA way, and named if that fails."""
    wrapper_type = _wrapper_type(d, architecture)
    wrapper = _WRAPPERS.get(wrapper_type, _WRAPPERS["llava"])
    text = d.get("text_config")
    if text is None and wrapper.flat_text:
        text = {k: v for k, v in d.items() if k not in ("vision_config", "architectures", "model_type")}
    elif text is None:
        text = {"model_type": wrapper.text_type, **wrapper.absent_text}
    if not isinstance(text, dict):
        raise CorruptFileError(f"config.json 'text_config' must be an object, got {type(text).__name__}")
    model_type = text.get("model_type", wrapper.text_type)
    family = _TEXT_FAMILIES.get(model_type)
    # Unknown family: keep its own architecture name so the model class can say what is unsupported.
    text_architecture = family.architecture if family else (text.get("architectures") or [model_type])[0]
    defaults = family.defaults if family else {}
    merged = {**defaults, **{k: d[k] for k in _SHARED_KEYS if k in d}, **text, "model_type": model_type}
    try:
        parsed = cls.from_hf_dict(merged, architecture=text_architecture)
    except ModelLoadError:
        if wrapper_type is None:
            _raise_unsupported(architecture)
        if family is not None:
            raise
        raise UnsupportedArchitectureError(
            f"config.json text_config model_type {model_type!r} (inside {architecture}) is not a supported "
            f"language model family; supported: {', '.join(_TEXT_FAMILIES)}."
        ) from None
    tied = bool(d.get("tie_word_embeddings", wrapper.tie)) or (wrapper.tie_follows_text and parsed.tie_word_embeddings)
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


def _raise_unsupported(architecture: str) -> None:
    """An architecture config.json names that no family here reads; the loader adds the supported list (the
    model registry sits above this module: every model imports it)."""
    raise UnsupportedArchitectureError(f"architecture {architecture!r} is not supported.", architecture=architecture)


def _sliding_window(d: dict[str, Any], architecture: str) -> int | None:
    """Mistral applies `sliding_window` on every layer; Qwen2/3 only when `use_sliding_window` is set."""
    window = d.get("sliding_window")
    if architecture.startswith("Qwen") and not d.get("use_sliding_window", False):
        return None
    return int(window) if window else None
