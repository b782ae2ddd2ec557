"""What a Hugging Face config.json leaves out, per family: transformers' config class defaults.

Released config.json files leave out every key whose value is the default of their transformers config class
(llava-1.5's text_config names little more than its model_type; Gemma 3's gives no head counts). Those
defaults are part of the format, so they are tabled here per text family (`TEXT_FAMILIES`) and per
vision-language wrapper (`WRAPPERS`, which also says what a left-out text_config means and how the wrapper ties
its head). engine/config/model.py's `ModelConfig.from_hf_dict` reads a config through them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
TEXT_FAMILIES: dict[str, _TextFamily] = {
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
    # The expert counts and size (num_experts, num_experts_per_tok, moe_intermediate_size) are left out: like the
    # shape keys they fix tensor shapes, so engine/models/qwen3_moe.py refuses a config without them.
    "qwen3_moe": _TextFamily(
        "Qwen3MoeForCausalLM",
        dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=24,
            num_attention_heads=32,
            num_key_value_heads=4,
            max_position_embeddings=32768,
            decoder_sparse_step=1,
            norm_topk_prob=False,
            mlp_only_layers=[],
        ),
    ),
    # The expert counts (num_local_experts, num_experts_per_tok) are left out, as for qwen3_moe:
    # engine/models/gpt_oss.py refuses a config without them. intermediate_size is each expert's.
    "gpt_oss": _TextFamily(
        "GptOssForCausalLM",
        dict(
            vocab_size=201088,
            hidden_size=2880,
            intermediate_size=2880,
            num_hidden_layers=36,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            sliding_window=128,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            attention_bias=True,
            swiglu_limit=7.0,
            swiglu_alpha=1.702,
            rope_parameters=dict(
                rope_type="yarn",
                factor=32.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=4096,
            ),
        ),
        default_theta=150000.0,
    ),
    # Phi-3 and Phi-4 (Phi-4-mini: partial rotary and LongRoPE, whose original context is this top-level key).
    "phi3": _TextFamily(
        "Phi3ForCausalLM",
        dict(
            vocab_size=32064,
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=4096,
            original_max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            bos_token_id=1,
            eos_token_id=32000,
            pad_token_id=32000,
        ),
    ),
    # SmolLM3: the layers without rotary (no_rope_layers, or every no_rope_layer_interval-th) are read by
    # engine/models/smollm3.py.
    "smollm3": _TextFamily(
        "SmolLM3ForCausalLM",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            no_rope_layer_interval=4,
            bos_token_id=128000,
            eos_token_id=128001,
            pad_token_id=128004,
        ),
        default_theta=2_000_000.0,
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


WRAPPERS: dict[str, _Wrapper] = {
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
SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Checkpoint-wide keys that older multimodal configs keep at the top level instead of in text_config.
SHARED_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype")


def wrapper_type_of(d: dict[str, Any], architecture: str) -> str | None:
    """The vision-language model_type of a config: its own, or the one its architecture belongs to."""
    if d.get("model_type") in WRAPPERS:
        return d["model_type"]
    return next((name for name, w in WRAPPERS.items() if architecture in w.architectures), None)
