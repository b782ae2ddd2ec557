"""Load a model from a Hugging Face folder or a GGUF file: config, weights, class, dtype, device."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from engine.config.model import ModelConfig
from engine.errors import MissingFileError, ModelLoadError, UnsupportedArchitectureError
from engine.memory import release_freed_memory
from engine.models.base import Model
from engine.models.registry import model_class
from kernels import ops

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def default_dtype(device: torch.device, checkpoint_dtype: str | None) -> torch.dtype:
    """bfloat16 on CPU (fastest here with AVX512-BF16); on CUDA the checkpoint's half type, else bfloat16."""
    if device.type == "cpu":
        return torch.bfloat16
    if checkpoint_dtype in ("float16", "bfloat16"):
        return _DTYPES[checkpoint_dtype]
    return torch.bfloat16


QUANTIZED_CHOICES = ("auto", "int4", None)


def default_quantized(device: torch.device, dtype: torch.dtype) -> str | None:
    """Keep GGUF weights quantized where decode is memory-bound and a kernel reads them: bfloat16 on a CPU (the C
    block kernels, torch's int4 matmul) and 16-bit floats on a CUDA GPU with triton (the Triton block matmul).
    float32 stays dequantized so it is the exact reference; other devices have no kernel."""
    if device.type == "cpu":
        return "int4" if dtype == torch.bfloat16 else None
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and ops.triton_available():
        return "int4"
    return None


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    if name is None or isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(_DTYPES)}") from None


def load_model(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    progress: Callable[[float], None] | None = None,
    quantized: str | None = "auto",
    mmproj: str | Path | None = None,
) -> Model:
    """Load `path` (a Hugging Face folder or a .gguf file) as the right `Model` subclass; see `Model.load`."""
    path = Path(path).expanduser()
    device = torch.device(device)
    dtype = parse_dtype(dtype)
    if quantized not in QUANTIZED_CHOICES:
        raise ValueError(f"quantized={quantized!r} is not one of {', '.join(map(repr, QUANTIZED_CHOICES))}")
    if not path.exists():
        raise MissingFileError(f"{path} does not exist. Pass a Hugging Face model folder or a .gguf file.")
    freq_factors = processor = vision_error = None
    if mmproj is not None and not (path.is_file() and path.suffix.lower() == ".gguf"):
        raise ModelLoadError(f"mmproj= pairs a projector with a text .gguf file; {path} is not one.")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(
                f"{path} is a file but not a .gguf file. Pass a .gguf file or the folder holding config.json."
            )
        from engine.gguf.checkpoint import load_gguf

        # GGUF checkpoints are mostly quantized: their "native" dtype says nothing, so use the device default.
        target = dtype or default_dtype(device, None)
        keep = default_quantized(device, target) if quantized == "auto" else quantized
        config, tensors = load_gguf(path, dtype=target, device=device, progress=progress, quantized=keep)
        freq_factors = tensors.pop("rope_freq_factors", None)
        from engine.loading.mmproj import pair_mmproj

        config, tensors, processor, vision_error = pair_mmproj(
            path,
            mmproj,
            config,
            tensors,
            target,
            device,
            has_rope_freq_factors=freq_factors is not None,
            quantized=keep,
        )
        release_freed_memory()  # the dequantization temporaries, before packing allocates again
    else:
        from engine.loading.safetensors import load_safetensors

        try:
            config = ModelConfig.from_file(path / "config.json")
        except UnsupportedArchitectureError as e:
            if e.architecture is not None:
                model_class(e.architecture)  # its error lists the supported architectures
            raise
        cls = model_class(config.architecture)  # fail on an unsupported architecture before reading weights
        target = dtype or default_dtype(device, config.torch_dtype)
        tensors = load_safetensors(path, dtype=target, device=device, progress=progress)
    cls = model_class(config.architecture)
    with torch.device("meta"):
        model = cls(config) if freq_factors is None else cls(config, rope_freq_factors=freq_factors)
    model.load_tensors(tensors)
    del tensors
    release_freed_memory()
    model.rope.inv_freq = model.rope.inv_freq.to(device)
    model.source_path = path
    model.vision_error = vision_error
    if processor is not None:  # from the mmproj: a GGUF has no preprocessor_config.json to read it from
        model.vision.processor = processor
    model.eval().requires_grad_(False)
    if device.type == "cpu":
        ops.prepare_cpu_kernels()  # compiled once per machine; later loads find them cached
    log.info("loaded %s (%s) from %s as %s on %s", config.architecture, model.__class__.__name__, path, target, device)
    return model


Model._loader = load_model  # what Model.load calls (engine/models/base.py)
