"""A ModelConfig from a GGUF file's metadata alone: llama.cpp's converter flattened the Hugging Face config into
`{arch}.*` keys, mapped back here (no tensor data is read)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engine.config.model import ModelConfig
from engine.errors import CorruptFileError, ModelLoadError, UnsupportedArchitectureError
from engine.gguf.file import GGUFFile
from engine.harmony import CHANNEL, HARMONY_STOPS

# GGUF `general.architecture` -> the Hugging Face class name the engine's registry knows.
# Mistral GGUFs say "llama": llama.cpp converts them with the Llama converter.
# qwen2vl: Qwen2-VL's language model, a Qwen2 whose M-RoPE sections (`rope.dimension_sections`) only matter
# beside images; as a text model (all three positions equal) it is a Qwen2. engine/loading/mmproj.py pairs it.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2vl": "Qwen2ForCausalLM",
    # Mistral 3's language model: llama's tensors and q/k order under another name (Ministral 3, whose queries
    # scale with position, is refused by _rope_scaling).
    "mistral3": "LlamaForCausalLM",
    # Gemma 3's language model (also inside Gemma3ForConditionalGeneration); the keys only Gemma reads are
    # `gemma3_text_keys`, the norms' +1 the converter adds is undone at load (engine/gguf/names.py).
    "gemma3": "Gemma3ForCausalLM",
    # Qwen3-MoE: qwen3's layers with experts in every one (`qwen3moe_keys`).
    "qwen3moe": "Qwen3MoeForCausalLM",
    # gpt-oss: experts with biases, attention sinks, sliding and full layers alternating (`gpt_oss_keys`).
    "gpt-oss": "GptOssForCausalLM",
    # Phi-3 / Phi-4: q/k/v and gate/up fused in the file as in our layers, partial rotary, LongRoPE (`phi3_keys`).
    "phi3": "Phi3ForCausalLM",
    # SmolLM3: llama's tensors (q/k in llama.cpp's row order), every fourth layer without rotary (`smollm3_keys`).
    "smollm3": "SmolLM3ForCausalLM",
}
# Tensors read into the config, not the model: LongRoPE's per-frequency divisors (`phi3_keys`).
LONGROPE_FACTORS = {"long_factor": "rope_factors_long.weight", "short_factor": "rope_factors_short.weight"}


def read_gguf_config(file: GGUFFile) -> ModelConfig:
    """The model config from a GGUF file's metadata alone (no tensor data is read)."""
    path = file.path
    if file.byte_order != "I":
        raise ModelLoadError(
            f"{path} is a big-endian GGUF file; Tandem reads little-endian GGUF only. "
            "Use the little-endian version of the model."
        )
    try:
        metadata = file.metadata
    except (UnicodeDecodeError, ValueError, IndexError) as e:
        raise CorruptFileError(
            f"{path} has unreadable metadata ({type(e).__name__}: {e}). It may be damaged; download it again."
        ) from None
    return _config_from_metadata(path, file.architecture, metadata, {t.name: t for t in file.tensors})


def _config_from_metadata(path: Path, arch: str, metadata: dict[str, Any], tensors: dict[str, Any]) -> ModelConfig:
    """Build the Hugging Face style config dict llama.cpp's converter flattened into `{arch}.*` keys."""
    if arch == "clip":
        raise UnsupportedArchitectureError(
            f"{path} is a vision projector (mmproj), not a model. Load the text .gguf that came with it: the "
            "projector beside it is paired with it (or pass mmproj=)."
        )
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{path} holds a {arch!r} model, which Tandem cannot run. Supported GGUF architectures: "
            f"{', '.join(ARCHITECTURES)}. Pick a GGUF of one of those."
        )

    def get(key: str, default: Any = None, required: bool = False) -> Any:
        value = metadata.get(f"{arch}.{key}", default)
        if required and value is None:
            raise CorruptFileError(
                f"{path} lacks the metadata key {arch}.{key}, which every {arch} GGUF has. "
                "The file is incomplete or was written by a broken converter; get another copy."
            )
        # Some converters store per-layer lists; these architectures use one value for all layers.
        if isinstance(value, list):
            if not value or len(set(value)) != 1:
                raise ModelLoadError(f"{path}: {arch}.{key} varies per layer ({value}); Tandem needs one value.")
            value = value[0]
        return value

    num_heads = get("attention.head_count", required=True)
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab_size = get("vocab_size") or (len(tokens) if isinstance(tokens, list) else None)
    if vocab_size is None and "token_embd.weight" in tensors:
        vocab_size = int(tensors["token_embd.weight"].shape[-1])  # GGUF dims run innermost first
    if vocab_size is None:
        raise CorruptFileError(f"{path} has neither a vocabulary size nor token embeddings; it is not a model.")
    head_dim = get("attention.key_length")
    if head_dim is None and arch == "llama":
        head_dim = get("rope.dimension_count")  # llama ropes the whole head, so this is the head size

    hf: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": get("embedding_length", required=True),
        "intermediate_size": get("feed_forward_length", required=True),
        "num_hidden_layers": get("block_count", required=True),
        "num_attention_heads": num_heads,
        "num_key_value_heads": get("attention.head_count_kv", num_heads),
        "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 2048),
        "rope_scaling": _rope_scaling(path, arch, get),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": _eos_ids(metadata),
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
        "gguf_architecture": arch,
    }
    if arch == "gemma3":
        hf |= gemma3_text_keys(metadata)
    if arch == "qwen3moe":
        hf |= qwen3moe_keys(get)
    if arch == "gpt-oss":
        hf |= gpt_oss_keys(get)
    if arch == "phi3":
        hf |= phi3_keys(path, get, tensors, hf)
    if arch == "smollm3":
        hf |= smollm3_keys()
    try:
        return ModelConfig.from_hf_dict(hf, architecture=ARCHITECTURES[arch])
    except ModelLoadError as e:
        raise CorruptFileError(f"{path} has inconsistent model metadata: {e}") from None


def gemma3_text_keys(metadata: dict[str, Any]) -> dict[str, Any]:
    """The Gemma-only Gemma3TextConfig keys of a `gemma3` GGUF, as llama.cpp's runtime reads the file
    (src/models/gemma3.cpp): what engine/models/gemma3/text.py's Gemma3TextSettings parses."""
    num_layers = metadata["gemma3.block_count"]
    hidden, num_heads = metadata["gemma3.embedding_length"], metadata["gemma3.attention.head_count"]
    head_dim = metadata.get("gemma3.attention.key_length") or hidden // num_heads
    window = metadata.get("gemma3.attention.sliding_window")
    # Without a window every layer is global. With one, the pattern key (a count, or one flag per layer) is
    # optional and 6 by default: five sliding layers, then a full one, as in every released Gemma 3.
    pattern = metadata.get("gemma3.attention.sliding_window_pattern", 6)
    if not window:
        is_sliding = [False] * num_layers
    elif isinstance(pattern, list):
        is_sliding = [bool(p) for p in pattern]
    else:
        is_sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(num_layers)]
    cap = metadata.get("gemma3.final_logit_softcapping")
    return {
        "sliding_window": window or None,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in is_sliding],
        "rope_local_base_freq": metadata.get("gemma3.rope.freq_base_swa", 10000.0),
        # Not in the file: llama.cpp scales queries by head_dim ** -0.5, and by (hidden / heads) ** -0.5 for the
        # 62-layer 27B, which is each released config's query_pre_attn_scalar.
        "query_pre_attn_scalar": hidden // num_heads if num_layers == 62 else head_dim,
        "final_logit_softcapping": cap or None,  # llama.cpp reads 0 (or none) as no capping
        "hidden_activation": "gelu_pytorch_tanh",  # ggml's GELU is the tanh approximation
    }


def qwen3moe_keys(get: Callable[..., Any]) -> dict[str, Any]:
    """The Qwen3MoeConfig expert keys of a `qwen3moe` GGUF (`get` reads `qwen3moe.*`, failing on an absent required
    key), as llama.cpp's runtime reads the file (src/models/qwen3moe.cpp): every layer sparse, the top-k weights
    renormalised (its graph fixes both; the file has no keys for them)."""
    return {
        "num_experts": get("expert_count", required=True),
        "num_experts_per_tok": get("expert_used_count", required=True),
        "moe_intermediate_size": get("expert_feed_forward_length", required=True),
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


def gpt_oss_keys(get: Callable[..., Any]) -> dict[str, Any]:
    """The GptOssConfig keys of a `gpt-oss` GGUF (`get` reads `gpt-oss.*`, failing on an absent required key), as
    llama.cpp's runtime reads the file (src/models/openai-moe.cpp): every even layer sliding, the experts'
    SwiGLU clamped at 7 with gain 1.702 (its graph fixes these; the file has no keys for them)."""
    num_layers = get("block_count", required=True)
    return {
        "num_local_experts": get("expert_count", required=True),
        "num_experts_per_tok": get("expert_used_count", required=True),
        "intermediate_size": get("expert_feed_forward_length", required=True),
        "sliding_window": get("attention.sliding_window", required=True),
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)],
        "swiglu_limit": 7.0,
        "swiglu_alpha": 1.702,
    }


def phi3_keys(path: Path, get: Callable[..., Any], tensors: dict[str, Any], hf: dict[str, Any]) -> dict[str, Any]:
    """The Phi3Config keys of a `phi3` GGUF (`get` reads `phi3.*`), as llama.cpp's converter writes them
    (conversion/phi.py): the rotary dimensions as `rope.dimension_count`, a sliding window of 0 for none, and
    LongRoPE as two tensors of divisors beside `rope.scaling.original_context_length` and `rope.scaling.attn_factor`
    (no `rope.scaling.type`)."""
    head_dim = hf["head_dim"] or hf["hidden_size"] // hf["num_attention_heads"]
    rotary = get("rope.dimension_count") or head_dim
    factor = rotary / head_dim
    if int(head_dim * factor) != rotary:  # a quotient rounded below: transformers' int() must give `rotary` back
        factor = math.nextafter(factor, math.inf)
    keys: dict[str, Any] = {"partial_rotary_factor": factor, "sliding_window": get("attention.sliding_window") or None}
    present = [name for name in LONGROPE_FACTORS.values() if name in tensors]
    if not present:
        return keys
    if len(present) == 1:
        missing = next(name for name in LONGROPE_FACTORS.values() if name not in tensors)
        raise CorruptFileError(
            f"{path} has {present[0]} but not {missing}: LongRoPE needs both sets of divisors. The file is "
            "incomplete; convert or download it again."
        )
    scaling: dict[str, Any] = {"rope_type": "longrope"}
    for key, name in LONGROPE_FACTORS.items():
        t = tensors[name]
        if t.tensor_type.name != "F32":
            raise CorruptFileError(f"{path}: {name} is {t.tensor_type.name}, but LongRoPE's divisors are F32.")
        scaling[key] = [float(v) for v in np.asarray(t.data, dtype=np.float32).reshape(-1)]
    original = get("rope.scaling.original_context_length")
    if original is None:  # which set a sequence takes hangs on it: no default stands in
        raise CorruptFileError(
            f"{path} has LongRoPE divisors but lacks phi3.rope.scaling.original_context_length, the context that "
            "decides between them. The file is incomplete; convert or download it again."
        )
    scaling["original_max_position_embeddings"] = original
    if (attention_factor := get("rope.scaling.attn_factor")) is not None:
        scaling["attention_factor"] = attention_factor
    return keys | {"rope_scaling": scaling}


def smollm3_keys() -> dict[str, Any]:
    """The SmolLM3Config keys of a `smollm3` GGUF, as llama.cpp's runtime reads the file (src/llama-model.cpp):
    no rotary on every fourth layer and no sliding window (its code fixes both; the file has no keys for them)."""
    return {"no_rope_layer_interval": 4, "use_sliding_window": False}


# yarn GGUFs whose config.json said `truncate: false` (the file cannot say it; llama.cpp's runtime always rounds the
# ramp's ends to whole dimensions): read as transformers reads the config they came from.
_YARN_UNTRUNCATED = {"gpt-oss"}


def _rope_scaling(path: Path, arch: str, get: Callable[..., Any]) -> dict | None:
    """The Hugging Face `rope_scaling` of llama.cpp's `{arch}.rope.scaling.*` keys."""
    kind, factor = get("rope.scaling.type"), get("rope.scaling.factor")
    if get("attention.temperature_scale"):
        # Ministral 3 (llama_4_scaling_beta): queries grow with log(position / original context).
        raise ModelLoadError(
            f"{path} scales queries by position ({arch}.attention.temperature_scale), which Tandem does not "
            "implement. Use a GGUF of a model without it."
        )
    if kind in (None, "none"):
        # Old files wrote only `rope.scale_linear`; llama.cpp still reads it as linear scaling.
        legacy_factor = get("rope.scale_linear")
        return {"rope_type": "linear", "factor": legacy_factor} if legacy_factor not in (None, 1.0) else None
    if kind == "linear":
        return {"rope_type": "linear", "factor": 1.0 if factor is None else factor}
    if kind != "yarn":
        raise ModelLoadError(
            f"{path} uses {kind!r} rope scaling, which Tandem does not implement (it supports linear, yarn and "
            "llama3-style frequency factors). Use a GGUF of the model without that context extension."
        )
    if factor is None:
        raise CorruptFileError(
            f"{path} uses yarn rope scaling without {arch}.rope.scaling.factor, so its frequencies are unknown. "
            "The file is incomplete; get another copy."
        )
    # The converter copies these from config.json's rope_parameters, and they are read back as transformers reads
    # that (llama.cpp's runtime reads the betas for mistral3 only, and recomputes the attention factor). Absent ones
    # take transformers' defaults; the original context is then `context_length`, as in llama.cpp.
    scaling: dict[str, Any] = {"rope_type": "yarn", "factor": factor}
    keys = {
        "original_max_position_embeddings": "rope.scaling.original_context_length",
        "beta_fast": "rope.scaling.yarn_beta_fast",
        "beta_slow": "rope.scaling.yarn_beta_slow",
        "attention_factor": "rope.scaling.yarn_attn_factor",
    }
    scaling |= {name: get(key) for name, key in keys.items() if get(key) is not None}
    if log_multiplier := get("rope.scaling.yarn_log_multiplier"):
        # llama.cpp reads it as mscale_all_dim beside an mscale of 1 (DeepSeek-2's 0.1x spelling is not read here).
        scaling |= {"mscale": 1.0, "mscale_all_dim": log_multiplier}
    if arch in _YARN_UNTRUNCATED:
        scaling["truncate"] = False
    return scaling


def _eos_ids(metadata: dict[str, Any]) -> list[int]:
    """eos plus llama.cpp's end-of-turn / end-of-message ids, which end a chat reply just the same, and in a
    harmony vocabulary (gpt-oss) <|return|> and <|call|>, which llama.cpp ends a reply at by their text."""
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = metadata.get(key)
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and CHANNEL in tokens:
        ids += [tokens.index(t) for t in HARMONY_STOPS if t in tokens and tokens.index(t) not in ids]
    return ids
