"""Load a GGUF checkpoint (llama.cpp's format) as a ModelConfig and a state dict with Hugging Face names.

Quantized tensors are dequantized with the `gguf` package, one tensor at a time, then cast to the
requested dtype and moved to the device, so the peak memory is the result plus one float32 tensor.
With `quantized="int4"`, Q4_0 / Q4_1 projection weights are instead returned as `QuantizedWeight`
records (4-bit values plus per-block scale and zero) for the model to pack.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.config import ModelConfig
from engine.errors import CorruptFileError, ModelLoadError, TensorMismatchError, UnsupportedArchitectureError
from engine.gguf_file import GGUFFile
from engine.memory import release_freed_memory, release_mapped_pages
from engine.models.linear import BlockWeight, QuantizedWeight, SplitWeight
from kernels import ops

log = logging.getLogger(__name__)

# GGUF `general.architecture` -> the Hugging Face class name the engine's registry knows.
# Mistral GGUFs say "llama": llama.cpp converts them with the Llama converter.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

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
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def load_gguf(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    progress: Callable[[float], None] | None = None,
    quantized: str | None = None,
) -> tuple[ModelConfig, dict[str, torch.Tensor | QuantizedWeight | SplitWeight]]:
    """Read a llama / qwen2 / qwen3 GGUF file into `(config, state_dict)`.

    The state dict uses Hugging Face names (`model.layers.0.self_attn.q_proj.weight`, ...) and the
    Hugging Face layout (llama.cpp's q/k row order undone); every tensor is `dtype` on `device`, except
    `rope_freq_factors` (llama3-style rope, present only if the file has `rope_freqs.weight`), which
    stays float32. `progress(fraction)` is called as tensors load. `quantized="int4"` keeps Q4_0 / Q4_1
    attention and MLP projection weights 4-bit (`QuantizedWeight`, same Hugging Face row order) and Q8_0
    ones, and a Q8_0 output head (tied or not), as two 4-bit planes (`SplitWeight`); projections, output
    heads and embedding tables a kernel on `device` reads in their own blocks (Q4_K, Q5_K, Q6_K, and Q8_0
    with rows of whole multiples of 256) stay in those blocks (`BlockWeight`), before any of that;
    None dequantizes everything.

    Raises MissingFileError, CorruptFileError, UnsupportedArchitectureError, TensorMismatchError, or
    ModelLoadError for a tensor type that cannot be dequantized; nothing is returned half-loaded.
    """
    import gguf  # heavy import kept out of module import time

    if quantized not in (None, "int4"):
        raise ValueError(f"quantized={quantized!r} is not supported; use 'int4' or None")
    file = GGUFFile.open(path)
    path = file.path
    config = read_gguf_config(file)
    tensors = {t.name: t for t in file.tensors}

    selected = _select_tensors(path, config, tensors)
    _check_types(path, [t for _, t in selected], gguf)

    report = progress or (lambda fraction: None)
    total_bytes = sum(int(t.n_bytes) for _, t in selected) or 1
    done_bytes = 0
    report(0.0)
    state_dict: dict[str, torch.Tensor | QuantizedWeight | SplitWeight] = {}
    for hf_name, t in selected:
        packs = quantized == "int4" and (hf_name.endswith("_proj.weight") or hf_name == "lm_head.weight")
        num_cols = int(t.shape[0])  # GGUF dims run innermost first
        keeps_blocks = (
            quantized == "int4"
            and (packs or hf_name == EMBEDDINGS)
            and ops.can_keep_blocks(t.tensor_type.name, device, dtype, num_cols, int(t.shape[1]))
        )
        try:
            tied_head = hf_name == EMBEDDINGS and config.tie_word_embeddings and t.tensor_type.name in _INT8_TYPES
            if quantized == "int4" and tied_head and not keeps_blocks:  # the tied head gets a packed copy
                # (made before the float embeddings, so the two transients are never alive together)
                state_dict["lm_head.weight"] = _int8_weight(t, dtype).map_rows(lambda rows: rows.to(device))
            if keeps_blocks:
                values = _block_weight(t, dtype)  # a tied head shares the embeddings' blocks (Linear.tie_to)
            elif packs and t.tensor_type.name in _INT4_TYPES:
                values = _int4_weight(t, dtype)
            elif packs and t.tensor_type.name in _INT8_TYPES:
                values = _int8_weight(t, dtype)
            else:
                values = _dequantize(t, gguf)
        except (ValueError, IndexError, TypeError, AssertionError, RuntimeError) as e:
            raise CorruptFileError(
                f"{path}: tensor {t.name} ({t.tensor_type.name}) could not be decoded "
                f"({type(e).__name__}: {e}). The file may be damaged; download it again."
            ) from None
        if isinstance(values, (QuantizedWeight, SplitWeight, BlockWeight)):
            values = values.map_rows(lambda rows: rows.to(device))
            if config.architecture == ARCHITECTURES["llama"]:
                values = values.map_rows(lambda rows, name=hf_name: _unpermute_llama_qk(name, rows, config))
            if isinstance(values, BlockWeight):
                values = _packed(values, t)
            state_dict[hf_name] = values
        elif hf_name == ROPE_FREQ_FACTORS:
            state_dict[hf_name] = values.to(device=device, dtype=torch.float32)
        else:
            values = values.to(device=device, dtype=dtype)
            if config.architecture == ARCHITECTURES["llama"]:
                values = _unpermute_llama_qk(hf_name, values, config)
            state_dict[hf_name] = values
        done_bytes += int(t.n_bytes)
        report(done_bytes / total_bytes)
    log.info("loaded %d tensors of %s (%s) as %s on %s", len(state_dict), path, config.architecture, dtype, device)
    return config, state_dict


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
        "rope_scaling": _rope_scaling(
            path, get("rope.scaling.type"), get("rope.scaling.factor"), get("rope.scale_linear")
        ),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": _eos_ids(metadata),
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
        "gguf_architecture": arch,
    }
    try:
        return ModelConfig.from_hf_dict(hf, architecture=ARCHITECTURES[arch])
    except ModelLoadError as e:
        raise CorruptFileError(f"{path} has inconsistent model metadata: {e}") from None


def _rope_scaling(path: Path, kind: str | None, factor: float | None, legacy_factor: float | None) -> dict | None:
    if kind in (None, "none"):
        # Old files wrote only `rope.scale_linear`; llama.cpp still reads it as linear scaling.
        return {"rope_type": "linear", "factor": legacy_factor} if legacy_factor not in (None, 1.0) else None
    if kind == "linear":
        return {"rope_type": "linear", "factor": 1.0 if factor is None else factor}
    raise ModelLoadError(
        f"{path} uses {kind!r} rope scaling, which Tandem does not implement (it supports linear and "
        "llama3-style frequency factors). Use a GGUF of the model without that context extension."
    )


def _eos_ids(metadata: dict[str, Any]) -> list[int]:
    """eos plus llama.cpp's end-of-turn / end-of-message ids, which end a chat reply just the same."""
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = metadata.get(key)
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    return ids


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        return None
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def _gguf_name(hf_name: str) -> str:
    """The inverse of `_hf_name`, for messages."""
    for gguf_name, name in _GLOBAL_NAMES.items():
        if name == hf_name:
            return gguf_name
    _, _, idx, rest = hf_name.split(".", 3)  # model.layers.{i}.{module}.{weight|bias}
    module, kind = rest.rsplit(".", 1)
    short = next(g for g, h in _LAYER_NAMES.items() if h == module)
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
    names += [f"model.layers.{i}.{s}" for i in range(config.num_hidden_layers) for s in per_layer]
    return names


def _select_tensors(path: Path, config: ModelConfig, tensors: dict[str, Any]) -> list[tuple[str, Any]]:
    """Pair each GGUF tensor with its Hugging Face name, checking presence and shape before any is read."""
    expected = _expected_shapes(config)
    selected: list[tuple[str, Any]] = []
    unknown: list[str] = []
    for name, t in tensors.items():
        hf_name = _hf_name(name)
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
        named = ", ".join(f"{_gguf_name(n)} ({n})" for n in missing[:4])
        raise TensorMismatchError(
            f"{path} is missing {len(missing)} tensor(s) a {config.architecture} with "
            f"{config.num_hidden_layers} layers needs: {named}{', ...' if len(missing) > 4 else ''}. "
            "The file is incomplete or not a plain text model; download or convert it again."
        )
    return selected


@cache
def _can_dequantize(qtype: Any) -> bool:
    import gguf

    if qtype in (
        gguf.GGMLQuantizationType.F32,
        gguf.GGMLQuantizationType.F16,
        gguf.GGMLQuantizationType.BF16,
    ):
        return True
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    try:  # one all-zero block: the gguf package raises NotImplementedError for types it cannot decode
        gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _check_types(path: Path, tensors: list[Any], gguf: Any) -> None:
    bad = [t for t in tensors if not _can_dequantize(t.tensor_type)]
    if bad:
        kinds = sorted({t.tensor_type.name for t in bad})
        raise ModelLoadError(
            f"{path}: tensor {bad[0].name} is stored as {', '.join(kinds)}, which the gguf package "
            f"(version {getattr(gguf, '__version__', 'installed')}) cannot dequantize. Use a GGUF quantized "
            "as F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL or IQ4_XS, or update the gguf package."
        )


def _dequantize(t: Any, gguf: Any) -> torch.Tensor:
    """One GGUF tensor as a float torch tensor in Hugging Face shape, copied out of the read-only mmap."""
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    qtype = t.tensor_type
    if qtype == gguf.GGMLQuantizationType.F32:
        return torch.from_numpy(np.array(t.data, dtype=np.float32)).reshape(shape)
    if qtype == gguf.GGMLQuantizationType.F16:
        return torch.from_numpy(np.array(t.data, dtype=np.float16)).reshape(shape)
    if qtype == gguf.GGMLQuantizationType.BF16:
        # the reader hands bfloat16 over as raw bytes; reinterpret them instead of widening in numpy
        raw = np.array(t.data, dtype=np.uint8).view(np.int16)
        return torch.from_numpy(raw).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(gguf.quants.dequantize(t.data, qtype)).reshape(shape)


_INT4_TYPES = ("Q4_0", "Q4_1")


def _int4_weight(t: Any, dtype: torch.dtype) -> QuantizedWeight:
    """A Q4_0 / Q4_1 tensor's blocks as 4-bit values with a scale and zero per block of 32 columns.

    ggml's blocks: Q4_0 = f16 d, 16 bytes; value d * (q - 8). Q4_1 = f16 d, f16 m, 16 bytes; value d * q + m.
    Byte j of a block holds element j in its low nibble and element j + 16 in its high nibble. Both are
    (q - 8) * scale + zero with scale = d and zero = 0 (Q4_0) or m + 8 d (Q4_1).
    """
    num_rows, num_cols = (int(d) for d in reversed(t.shape.tolist()))
    has_min = t.tensor_type.name == "Q4_1"
    header = 4 if has_min else 2
    blocks = torch.from_numpy(np.array(t.data, dtype=np.uint8)).reshape(num_rows, num_cols // 32, header + 16)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()  # [N, K / 32]
    qs = blocks[..., header:]
    values = torch.cat((qs & 15, qs >> 4), dim=-1).reshape(num_rows, num_cols)  # [N, K] uint8
    if has_min:
        zeros = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float() + 8.0 * d
    else:
        zeros = torch.zeros_like(d)
    return QuantizedWeight(values, d, zeros, group_size=32, dtype=dtype)


_INT8_TYPES = ("Q8_0",)
EMBEDDINGS = "model.embed_tokens.weight"


def _block_weight(t: Any, dtype: torch.dtype) -> BlockWeight:
    """A block-quantized tensor as its rows of blocks: a view of the memory-mapped file, not a copy, so its
    pages are the file's own (read in as the kernels first touch them, never duplicated)."""
    num_rows, num_cols = (int(d) for d in reversed(t.shape.tolist()))
    with warnings.catch_warnings():  # the map is read-only, and so is every use of the blocks
        warnings.simplefilter("ignore", UserWarning)
        blocks = torch.from_numpy(t.data.view(np.uint8)).reshape(num_rows, -1)
    expected = ops.block_row_bytes(t.tensor_type.name, num_cols)
    if blocks.shape[1] != expected:
        raise ValueError(f"{blocks.shape[1]} bytes per row, not {expected}")
    return BlockWeight([(blocks, t.tensor_type.name)], num_cols, dtype)


def _packed(weight: BlockWeight, t: Any) -> BlockWeight:
    """`weight` in the layout its kernel reads. Where that is a copy (a repacked type), the file's pages it was
    read from leave the process's resident memory at once, so the load's peak stays near its end state."""
    packed = weight.packed()
    if packed.parts[0][0].data_ptr() != weight.parts[0][0].data_ptr():
        release_mapped_pages(t.data.ctypes.data, int(t.n_bytes))
        release_freed_memory()  # the repacking's temporaries (engine/memory.py)
    return packed


def _int8_weight(t: Any, dtype: torch.dtype) -> SplitWeight:
    """A Q8_0 tensor as two 4-bit planes (`SplitWeight`): ggml's block is f16 d and 32 int8 q, value d * q."""
    num_rows, num_cols = (int(d) for d in reversed(t.shape.tolist()))
    blocks = torch.from_numpy(np.array(t.data, dtype=np.uint8)).reshape(num_rows, num_cols // 32, 2 + 32)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()  # [N, K / 32]
    q = blocks[..., 2:].contiguous().view(torch.int8).reshape(num_rows, num_cols)
    return SplitWeight.from_int8(q, d, group_size=32, dtype=dtype)


def _unpermute_llama_qk(hf_name: str, values: torch.Tensor, config: ModelConfig) -> torch.Tensor:
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
