"""GGUF tensors as Hugging Face checkpoint entries: their names, the shapes a config allows, the ones it needs,
llama.cpp's q/k row order undone, and Gemma's norm weights shifted back. A mixture-of-experts file's experts
keep their 3-D tensors ([experts, rows, cols] in Hugging Face order) under names of their own."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch

from engine.config.gguf import ARCHITECTURES, LONGROPE_FACTORS
from engine.config.model import ModelConfig
from engine.errors import TensorMismatchError

log = logging.getLogger(__name__)

ROPE_FREQ_FACTORS = "rope_freq_factors"  # the state-dict key for llama.cpp's `rope_freqs.weight`

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": ROPE_FREQ_FACTORS,
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3's layers have four norms: llama.cpp's ffn_norm is the one before the MLP, and the outputs of attention
# and MLP are normed again (gguf-py's ATTN_POST_NORM, FFN_PRE_NORM, FFN_POST_NORM).
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# A mixture-of-experts layer's router, and its experts' projections as 3-D tensors [experts, rows, cols] (in
# Hugging Face order; engine/models/qwen3_moe.py joins gate and up).
_MOE_LAYER_NAMES = {
    **_LAYER_NAMES,
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
# gpt-oss: the router under transformers' name, with a bias as every projection has, and a sink per head.
_GPT_OSS_LAYER_NAMES = {
    **_MOE_LAYER_NAMES,
    "ffn_gate_inp": "mlp.router",
    "attn_sinks": "self_attn.sinks",
    "post_attention_norm": "post_attention_layernorm",
}
# Phi-3: q/k/v in one tensor and gate/up in another (llama.cpp's ffn_up holds [gate | up]), as in our layers.
_PHI3_LAYER_NAMES = {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_PHI3_PARTS = ["self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight"]
_PHI3_PARTS += ["mlp.down_proj.weight"]
_GPT_OSS_PARTS = ["mlp.router.weight", "mlp.router.bias", "self_attn.sinks.weight"]
_GPT_OSS_PARTS += [f"mlp.experts.{p}_proj.{kind}" for p in ("gate", "up", "down") for kind in ("weight", "bias")]
_GPT_OSS_PARTS += [f"self_attn.{p}_proj.bias" for p in "qkvo"]
_MOE_PARTS = ["mlp.gate.weight"] + [f"mlp.experts.{p}_proj.weight" for p in ("gate", "up", "down")]
_GEMMA3_NORMS = ["input_layernorm.weight", "post_attention_layernorm.weight"]
_GEMMA3_NORMS += ["pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"]
_GEMMA3_NORMS += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
EMBEDDINGS = "model.embed_tokens.weight"
# Architectures whose q/k rows llama.cpp's converter interleaves for its rope kernel (`unpermute_llama_qk`).
LLAMA_QK_ORDER = frozenset({ARCHITECTURES["llama"], ARCHITECTURES["smollm3"]})
# Tensors the config reads (engine/config/gguf.py), not the model.
_CONFIG_TENSORS = frozenset(LONGROPE_FACTORS.values())


def _is_gemma3(config: ModelConfig) -> bool:
    return config.architecture == ARCHITECTURES["gemma3"]


def _is_gpt_oss(config: ModelConfig) -> bool:
    return config.architecture == ARCHITECTURES["gpt-oss"]


def _is_phi3(config: ModelConfig) -> bool:
    return config.architecture == ARCHITECTURES["phi3"]


def _experts(config: ModelConfig) -> tuple[int, int] | None:
    """(experts, each expert's intermediate size) of a mixture-of-experts config (engine/config/gguf.py's
    `qwen3moe_keys` and `gpt_oss_keys`: every layer sparse), None for a dense one."""
    if _is_gpt_oss(config):
        return config.extra["num_local_experts"], config.intermediate_size
    if config.architecture != ARCHITECTURES["qwen3moe"]:
        return None
    return config.extra["num_experts"], config.extra["moe_intermediate_size"]


def _layer_names(config: ModelConfig) -> dict[str, str]:
    if _is_gpt_oss(config):
        return _GPT_OSS_LAYER_NAMES
    if _experts(config) is not None:
        return _MOE_LAYER_NAMES
    if _is_phi3(config):
        return _PHI3_LAYER_NAMES
    return _GEMMA3_LAYER_NAMES if _is_gemma3(config) else _LAYER_NAMES


def _hf_name(gguf_name: str, layer_names: dict[str, str]) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m is None or m.group(2) not in layer_names:
        return None
    return f"model.layers.{m.group(1)}.{layer_names[m.group(2)]}.{m.group(3)}"


def _gguf_name(hf_name: str, layer_names: dict[str, str]) -> str:
    """The inverse of `_hf_name`, for messages."""
    for gguf_name, name in _GLOBAL_NAMES.items():
        if name == hf_name:
            return gguf_name
    _, _, idx, rest = hf_name.split(".", 3)  # model.layers.{i}.{module}.{weight|bias}
    module, kind = rest.rsplit(".", 1)
    short = next(g for g, h in layer_names.items() if h == module)
    return f"blk.{idx}.{short}.{kind}"


def _expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config allows, in Hugging Face shape ([out_features, in_features])."""
    hidden, inter, hd = config.hidden_size, config.intermediate_size, config.head_dim
    q_out, kv_out = config.num_attention_heads * hd, config.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (config.vocab_size, hidden),
        ROPE_FREQ_FACTORS: (hd // 2,),
    }
    per_layer = {
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q_out, hidden),
        "self_attn.k_proj.weight": (kv_out, hidden),
        "self_attn.v_proj.weight": (kv_out, hidden),
        "self_attn.o_proj.weight": (hidden, q_out),
        "self_attn.q_proj.bias": (q_out,),
        "self_attn.k_proj.bias": (kv_out,),
        "self_attn.v_proj.bias": (kv_out,),
        "self_attn.o_proj.bias": (hidden,),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "mlp.gate_proj.bias": (inter,),
        "mlp.up_proj.bias": (inter,),
        "mlp.down_proj.bias": (hidden,),
    }
    if _is_phi3(config):
        per_layer |= {
            "self_attn.qkv_proj.weight": (q_out + 2 * kv_out, hidden),
            "mlp.gate_up_proj.weight": (2 * inter, hidden),
        }
    if _is_gemma3(config):
        shapes.pop(ROPE_FREQ_FACTORS)  # llama.cpp's gemma3 has no llama3-style rope: such a tensor is not read
        per_layer |= {"pre_feedforward_layernorm.weight": (hidden,), "post_feedforward_layernorm.weight": (hidden,)}
    if (experts := _experts(config)) is not None:
        num_experts, size = experts
        per_layer |= {
            "mlp.gate.weight": (num_experts, hidden),
            "mlp.experts.gate_proj.weight": (num_experts, size, hidden),
            "mlp.experts.up_proj.weight": (num_experts, size, hidden),
            "mlp.experts.down_proj.weight": (num_experts, hidden, size),
        }
    if _is_gpt_oss(config):
        num_experts, size = experts
        per_layer |= {
            "mlp.router.weight": (num_experts, hidden),
            "mlp.router.bias": (num_experts,),
            "mlp.experts.gate_proj.bias": (num_experts, size),
            "mlp.experts.up_proj.bias": (num_experts, size),
            "mlp.experts.down_proj.bias": (num_experts, hidden),
            "self_attn.sinks.weight": (config.num_attention_heads,),
        }
    for i in range(config.num_hidden_layers):
        for suffix, shape in per_layer.items():
            shapes[f"model.layers.{i}.{suffix}"] = shape
    return shapes


def _required_names(config: ModelConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    per_layer = ["input_layernorm.weight", "post_attention_layernorm.weight"]
    per_layer += [f"self_attn.{p}_proj.weight" for p in "qkvo"] + [
        f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")
    ]
    if config.architecture == ARCHITECTURES["qwen2"]:
        per_layer += [f"self_attn.{p}_proj.bias" for p in "qkv"]
    if config.qk_norm:
        per_layer += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    if _is_gemma3(config):
        per_layer += [name for name in _GEMMA3_NORMS if name not in per_layer]
    if _is_phi3(config):
        per_layer = per_layer[:2] + _PHI3_PARTS
    if _experts(config) is not None:
        parts = _GPT_OSS_PARTS if _is_gpt_oss(config) else _MOE_PARTS
        per_layer = [name for name in per_layer if not name.startswith("mlp.") and name not in parts] + parts
    names += [f"model.layers.{i}.{s}" for i in range(config.num_hidden_layers) for s in per_layer]
    return names


def select_tensors(path: Path, config: ModelConfig, tensors: dict[str, Any]) -> list[tuple[str, Any]]:
    """Pair each GGUF tensor with its Hugging Face name, checking presence and shape before any is read."""
    expected = _expected_shapes(config)
    layer_names = _layer_names(config)
    selected: list[tuple[str, Any]] = []
    unknown: list[str] = []
    for name, t in tensors.items():
        if name in _CONFIG_TENSORS:
            continue
        hf_name = _hf_name(name, layer_names)
        if hf_name is None or hf_name not in expected:
            unknown.append(name)
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists dims innermost first
        if shape != expected[hf_name]:
            raise TensorMismatchError(
                f"{path}: tensor {name} ({hf_name}) has shape {list(shape)}, but the file's metadata "
                f"(hidden {config.hidden_size}, {config.num_attention_heads} heads, "
                f"{config.num_key_value_heads} kv heads, head_dim {config.head_dim}, "
                f"vocab {config.vocab_size}) requires {list(expected[hf_name])}. "
                "The file is inconsistent; download or convert it again."
            )
        selected.append((hf_name, t))
    if unknown:
        log.warning("%s: ignoring %d tensors Tandem does not use: %s", path, len(unknown), ", ".join(unknown[:8]))
    present = {hf_name for hf_name, _ in selected}
    missing = [n for n in _required_names(config) if n not in present]
    if missing:
        named = ", ".join(f"{_gguf_name(n, layer_names)} ({n})" for n in missing[:4])
        raise TensorMismatchError(
            f"{path} is missing {len(missing)} tensor(s) a {config.architecture} with "
            f"{config.num_hidden_layers} layers needs: {named}{', ...' if len(missing) > 4 else ''}. "
            "The file is incomplete or not a plain text model; download or convert it again."
        )
    return selected


def unpermute_llama_qk(hf_name: str, values: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Undo the row order llama.cpp's Llama converter gives q/k (weights and biases) for its rope kernel.

    Within each head of `head_dim` rows, Hugging Face rotates row i with row i + head_dim/2;
    llama.cpp rotates adjacent rows, so its converter interleaves the two halves:

        HF   : r0 r1 ... r(d/2-1) | r(d/2) ... r(d-1)
        GGUF : r0 r(d/2) r1 r(d/2+1) ... r(d/2-1) r(d-1)
    """
    if hf_name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        num_heads = config.num_attention_heads
    elif hf_name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
        num_heads = config.num_key_value_heads
    else:
        return values
    rest = values.shape[1:]
    pairs = values.reshape(num_heads, values.shape[0] // num_heads // 2, 2, *rest)
    return pairs.transpose(1, 2).reshape(values.shape)


def unshift_gemma3_norm(hf_name: str, values: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Undo the 1 llama.cpp's Gemma 3 converter adds to every RMSNorm weight (ggml scales by the weight, Gemma
    by 1 + weight), in float32: fl(fl(w + 1) - 1) + 1 gives back fl(w + 1), the scale the file's model uses."""
    if not (_is_gemma3(config) and hf_name.endswith("norm.weight")):
        return values
    return values.float() - 1.0
