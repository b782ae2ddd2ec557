"""Model configuration parsed at the edge (config.json or GGUF metadata) into a frozen dataclass.

A config.json is read with the defaults its transformers config class leaves out (engine/config/families.py);
GGUF metadata is mapped to the same keys by engine/config/gguf.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.config.families import SHAPE_KEYS, SHARED_KEYS, TEXT_FAMILIES, WRAPPERS, wrapper_type_of
from engine.errors import CorruptFileError, MissingFileError, ModelLoadError, UnsupportedArchitectureError


@dataclass(frozen=True)
class RopeScaling:
    """Rotary-embedding frequency scaling, as HF `rope_scaling` describes it.

    yarn (YaRN) blends interpolated (divided by `factor`) and original frequencies by a ramp between the
    dimensions that turn `beta_fast` and `beta_slow` times within the original context, and multiplies cos and
    sin by `attention_factor` (resolved here from `mscale` / `mscale_all_dim` when the config does not give it).

    longrope (LongRoPE: Phi-3, Phi-4-mini) divides each frequency by its own factor, from `short_factor` within
    the original context and from `long_factor` past it (which context decides: engine/models/rope.py's
    LongRopeTable), and multiplies cos and sin by sqrt(1 + ln(factor) / ln(original context)) unless the config
    gives `attention_factor`, as transformers' `_compute_longrope_parameters` does."""

    rope_type: str  # "default", "linear", "llama3", "yarn" or "longrope"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True  # yarn: round the ramp's ends to whole dimensions (gpt-oss says false)
    attention_factor: float = 1.0  # scale on cos and sin (yarn, longrope); 1 for the other types
    short_factor: tuple[float, ...] = ()  # longrope: one divisor per frequency, within the original context
    long_factor: tuple[float, ...] = ()  # longrope: the same, past it

    SUPPORTED = ("default", "linear", "llama3", "yarn", "longrope")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, max_position_embeddings: int = 8192) -> RopeScaling | None:
        """Parse `rope_scaling` / `rope_parameters`; the original context defaults to `max_position_embeddings`,
        and yarn's other keys to transformers' defaults, as transformers fills them in."""
        if not d:
            return None
        rope_type = d.get("rope_type", d.get("type", "default"))
        if rope_type == "mrope":
            rope_type = "default"  # Qwen2-VL's multimodal sections (read by its model) over plain frequencies
        if rope_type == "su":
            rope_type = "longrope"  # the first Phi-3 configs' name for it
        if rope_type not in cls.SUPPORTED:
            raise ModelLoadError(
                f"rope_scaling type {rope_type!r} is not supported; supported types are "
                f"{', '.join(cls.SUPPORTED)}. Use a checkpoint with one of those."
            )
        if rope_type == "default":
            return None
        original = int(d.get("original_max_position_embeddings") or max_position_embeddings)
        if rope_type == "yarn":
            return cls._yarn(d, original, max_position_embeddings)
        if rope_type == "longrope":
            return cls._longrope(d, original, max_position_embeddings)
        return cls(
            rope_type=rope_type,
            factor=float(d.get("factor", 1.0)),
            low_freq_factor=float(d.get("low_freq_factor", 1.0)),
            high_freq_factor=float(d.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=original,
        )

    @classmethod
    def _yarn(cls, d: dict[str, Any], original: int, max_position_embeddings: int) -> RopeScaling:
        if "factor" not in d:
            raise ModelLoadError(
                "rope_scaling of type 'yarn' has no 'factor' (how many times the original context it stretches "
                "to); config.json is incomplete. Add it, e.g. max_position_embeddings / "
                "original_max_position_embeddings."
            )
        # A null factor is that ratio (DeepSeek-V3's convention in transformers).
        factor = float(d["factor"] if d["factor"] is not None else max_position_embeddings / original)
        attention_factor = d.get("attention_factor")
        if attention_factor is None:
            mscale, mscale_all_dim = d.get("mscale"), d.get("mscale_all_dim")
            if mscale and mscale_all_dim:  # DeepSeek: the ratio of two magnitudes
                attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
            else:
                attention_factor = _yarn_mscale(factor)
        return cls(
            rope_type="yarn",
            factor=factor,
            original_max_position_embeddings=original,
            # transformers reads a missing or zero beta as the paper's default.
            beta_fast=float(d.get("beta_fast") or 32.0),
            beta_slow=float(d.get("beta_slow") or 1.0),
            truncate=bool(d.get("truncate", True)),
            attention_factor=float(attention_factor),
        )

    @classmethod
    def _longrope(cls, d: dict[str, Any], original: int, max_position_embeddings: int) -> RopeScaling:
        """The factor lists' lengths are checked against the rotary dimension where the table is built."""
        factors = {}
        for key in ("short_factor", "long_factor"):
            values = d.get(key)
            if (
                not isinstance(values, list)
                or not values
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in values)
            ):
                raise ModelLoadError(
                    f"rope_scaling of type 'longrope' needs {key!r}, a list of positive numbers (one per rotary "
                    f"frequency), got {values!r}. config.json is incomplete or damaged; use the model's own."
                )
            factors[key] = tuple(float(v) for v in values)
        # Without `factor`, the stretch is the ratio of the two contexts (Phi-3's convention in transformers).
        factor = float(d.get("factor") or max_position_embeddings / original)
        attention_factor = d.get("attention_factor")
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        return cls(
            rope_type="longrope",
            factor=factor,
            original_max_position_embeddings=original,
            attention_factor=float(attention_factor),
            **factors,
        )


# Rope types whose original context transformers reads from a top-level `original_max_position_embeddings` first.
_ORIGINAL_FIRST = ("llama3", "yarn", "longrope", "su")


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for stretching the context `factor` times: 0.1 * mscale * ln(factor) + 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


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
    # The fraction of each head that rotary turns (its first `rotary_dim` dimensions; Phi-4-mini 0.75), the rest
    # passing through unrotated.
    partial_rotary_factor: float = 1.0
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

    @property
    def rotary_dim(self) -> int:
        """The dimensions of each head that rotary turns, as transformers rounds them."""
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], architecture: str | None = None) -> ModelConfig:
        """Parse a Hugging Face config.json dict; `architecture` overrides `architectures[0]`.

        Keys the dict leaves out take the defaults of its `model_type`'s transformers config class, except that
        a text-only config must give its shape (`SHAPE_KEYS`); a vision-language one is read by its wrapper's
        rules (`WRAPPERS`)."""
        if architecture is None:
            archs = d.get("architectures") or []
            if not archs:
                raise ModelLoadError(
                    "config.json has no 'architectures' entry, so the model class is unknown. "
                    'Add e.g. "architectures": ["LlamaForCausalLM"] to config.json.'
                )
            architecture = archs[0]
        if "text_config" in d or "vision_config" in d or wrapper_type_of(d, architecture) is not None:
            return _from_multimodal_dict(cls, d, architecture)
        family = TEXT_FAMILIES.get(d.get("model_type"))
        default_theta = 10000.0
        if family is not None:
            # transformers writes every shape key of a top-level config (only nested sub-configs leave out those
            # equal to their class defaults), so a missing one means a damaged file: it stays an error here.
            d = {**{k: v for k, v in family.defaults.items() if k not in SHAPE_KEYS}, **d}
            default_theta = family.default_theta
        # transformers >= 5 writes `rope_parameters` (with rope_theta inside) instead of `rope_scaling`.
        rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
        is_scaled = isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in _ORIGINAL_FIRST
        if is_scaled and d.get("original_max_position_embeddings"):
            # transformers takes a top-level original context over the rope dict's (Phi-3 keeps it there).
            rope = {**rope, "original_max_position_embeddings": d["original_max_position_embeddings"]}
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
                partial_rotary_factor=float(rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))),
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


def _from_multimodal_dict(cls: type[ModelConfig], d: dict[str, Any], architecture: str) -> ModelConfig:
    """A wrapper config (LLaVA and kin): the text fields come from `text_config`, completed with the defaults
    of its text family (as the wrapper's transformers config class picks it); the architecture stays the
    wrapper's. A wrapper Tandem does not know is read the LLaVA way, and named if that fails."""
    wrapper_type = wrapper_type_of(d, architecture)
    wrapper = WRAPPERS.get(wrapper_type, WRAPPERS["llava"])
    text = d.get("text_config")
    if text is None and wrapper.flat_text:
        text = {k: v for k, v in d.items() if k not in ("vision_config", "architectures", "model_type")}
    elif text is None:
        text = {"model_type": wrapper.text_type, **wrapper.absent_text}
    if not isinstance(text, dict):
        raise CorruptFileError(f"config.json 'text_config' must be an object, got {type(text).__name__}")
    model_type = text.get("model_type", wrapper.text_type)
    family = TEXT_FAMILIES.get(model_type)
    # Unknown family: keep its own architecture name so the model class can say what is unsupported.
    text_architecture = family.architecture if family else (text.get("architectures") or [model_type])[0]
    defaults = family.defaults if family else {}
    merged = {**defaults, **{k: d[k] for k in SHARED_KEYS if k in d}, **text, "model_type": model_type}
    try:
        parsed = cls.from_hf_dict(merged, architecture=text_architecture)
    except ModelLoadError:
        if wrapper_type is None:
            _raise_unsupported(architecture)
        if family is not None:
            raise
        raise UnsupportedArchitectureError(
            f"config.json text_config model_type {model_type!r} (inside {architecture}) is not a supported "
            f"language model family; supported: {', '.join(TEXT_FAMILIES)}."
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
    if not 0 < config.partial_rotary_factor <= 1 or config.rotary_dim < 2 or config.rotary_dim % 2:
        raise CorruptFileError(
            f"config.json: partial_rotary_factor {config.partial_rotary_factor} of head_dim {config.head_dim} gives "
            f"{config.rotary_dim} rotary dimensions; rotary needs an even number from 2 to head_dim. Fix or "
            "re-download the file."
        )
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


def _sliding_window(d: dict[str, Any], architecture: str) -> int | None:
    """Mistral applies `sliding_window` on every layer; Qwen2/3 and SmolLM3 only when `use_sliding_window` is
    set (SmolLM3 then on the layers `layer_types` names, engine/models/smollm3.py)."""
    window = d.get("sliding_window")
    if architecture.startswith(("Qwen", "SmolLM3")) and not d.get("use_sliding_window", False):
        return None
    return int(window) if window else None
