"""Load a GGUF checkpoint (llama.cpp's format) as a ModelConfig and a state dict with Hugging Face names.

Quantized tensors are dequantized with the `gguf` package, one tensor at a time, then cast to the
requested dtype and moved to the device, so the peak memory is the result plus one float32 tensor.
With `quantized="int4"`, Q4_0 / Q4_1 projection weights are instead returned as `QuantizedWeight`
records (4-bit values plus per-block scale and zero) for the model to pack.

    engine/config/gguf.py          the metadata -> ModelConfig
    engine/gguf/names.py   tensor names and shapes -> Hugging Face state-dict entries
    engine/gguf/tensors.py one tensor's data -> a float tensor or a quantized weight
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from engine.config.gguf import read_gguf_config
from engine.config.model import ModelConfig
from engine.errors import CorruptFileError
from engine.gguf.file import GGUFFile
from engine.gguf.names import (
    EMBEDDINGS,
    LLAMA_QK_ORDER,
    ROPE_FREQ_FACTORS,
    select_tensors,
    unpermute_llama_qk,
    unshift_gemma3_norm,
)
from engine.gguf.tensors import (
    INT4_TYPES,
    INT8_TYPES,
    block_weight,
    check_types,
    dequantize,
    int4_weight,
    int8_weight,
    packed,
)
from engine.models.linear import BlockWeight, QuantizedWeight, SplitWeight
from kernels import ops

log = logging.getLogger(__name__)


def load_gguf(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    progress: Callable[[float], None] | None = None,
    quantized: str | None = None,
) -> tuple[ModelConfig, dict[str, torch.Tensor | QuantizedWeight | SplitWeight]]:
    """Read a GGUF file of an architecture in engine/config/gguf.py's ARCHITECTURES (llama, qwen2, qwen3, gemma3,
    ...) into `(config, state_dict)`.

    The state dict uses Hugging Face names (`model.layers.0.self_attn.q_proj.weight`, ...) and the
    Hugging Face layout (llama.cpp's q/k row order undone, Gemma's norm weights without the converter's +1);
    every tensor is `dtype` on `device`, except `rope_freq_factors` (llama3-style rope, present only if the file has `rope_freqs.weight`), which
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

    selected = select_tensors(path, config, tensors)
    check_types(path, [t for _, t in selected], gguf)

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
            tied_head = hf_name == EMBEDDINGS and config.tie_word_embeddings and t.tensor_type.name in INT8_TYPES
            if quantized == "int4" and tied_head and not keeps_blocks:  # the tied head gets a packed copy
                # (made before the float embeddings, so the two transients are never alive together)
                state_dict["lm_head.weight"] = int8_weight(t, dtype).map_rows(lambda rows: rows.to(device))
            if keeps_blocks:
                values = block_weight(t, dtype)  # a tied head shares the embeddings' blocks (Linear.tie_to)
            elif packs and t.tensor_type.name in INT4_TYPES:
                values = int4_weight(t, dtype)
            elif packs and t.tensor_type.name in INT8_TYPES:
                values = int8_weight(t, dtype)
            else:
                values = dequantize(t, gguf)
        except (ValueError, IndexError, TypeError, AssertionError, RuntimeError) as e:
            raise CorruptFileError(
                f"{path}: tensor {t.name} ({t.tensor_type.name}) could not be decoded "
                f"({type(e).__name__}: {e}). The file may be damaged; download it again."
            ) from None
        if isinstance(values, (QuantizedWeight, SplitWeight, BlockWeight)):
            values = values.map_rows(lambda rows: rows.to(device))
            if config.architecture in LLAMA_QK_ORDER:
                values = values.map_rows(lambda rows, name=hf_name: unpermute_llama_qk(name, rows, config))
            if isinstance(values, BlockWeight):
                values = packed(values, t)
            state_dict[hf_name] = values
        elif hf_name == ROPE_FREQ_FACTORS:
            state_dict[hf_name] = values.to(device=device, dtype=torch.float32)
        else:
            values = unshift_gemma3_norm(hf_name, values, config).to(device=device, dtype=dtype)
            if config.architecture in LLAMA_QK_ORDER:
                values = unpermute_llama_qk(hf_name, values, config)
            state_dict[hf_name] = values
        done_bytes += int(t.n_bytes)
        report(done_bytes / total_bytes)
    log.info("loaded %d tensors of %s (%s) as %s on %s", len(state_dict), path, config.architecture, dtype, device)
    return config, state_dict
