"""What a model on disk is, read from its headers alone: a GGUF file's metadata and tensor infos, or a Hugging
Face folder's config.json and safetensors headers. No weight is read, so a model manager can describe a list
of multi-gigabyte files in milliseconds (after the first parse of each GGUF header, which is cached).

The app's model cards, its memory check before loading and the CLI's `info` command all read this one
`ModelInfo`; the memory it needs at a context is `engine.memory_fit`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from engine.config.model import ModelConfig
from engine.errors import CorruptFileError, MissingFileError, ModelLoadError
from engine.models.registry import supported_architectures, vision_architectures

# GGUF tensor types that hold plain floats: loading converts them to the compute dtype. Every other type is
# block-quantized and stays in its blocks on the CPU (ARCHITECTURE.md, "Weights").
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})


@dataclass(frozen=True)
class ModelInfo:
    """One model's card: what it is, how big, and the shape its KV cache takes.

    `architecture` is as the file names it (GGUF "llama", HF "LlamaForCausalLM"); `engine_architecture` is the
    engine's class name for it (None when unknown). `quantization` is a GGUF file's type ("Q4_K_M"; when the
    file does not say, its dominant tensor type) or a folder's checkpoint dtype ("bfloat16"). The KV shape
    (`num_layers`, `num_kv_heads`, `head_dim`) is None when the config cannot be parsed for this engine.
    """

    path: Path
    name: str
    format: str  # "gguf" or "huggingface"
    architecture: str
    engine_architecture: str | None
    size_bytes: int
    num_parameters: int | None
    quantization: str | None
    context_length: int | None
    can_see_images: bool
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    # Bytes of block-quantized tensors (resident as they are when kept in blocks) and the element count of
    # float tensors (resident at the compute dtype's size): the two parts of the weights' memory.
    packed_bytes: int = 0
    num_float_parameters: int = 0
    checkpoint_dtype: str | None = None  # a folder's torch_dtype, which picks the dtype on CUDA
    # Layers that attend to the last `sliding_window` positions only: their cache keeps a pool of pages, not the
    # whole context (engine/cache/window.py).
    num_sliding_layers: int = 0
    sliding_window: int | None = None
    # Layers that keep a recurrent state per sequence instead of KV pages (Qwen3.5's linear attention), and the
    # elements of one layer's state: its conv window (in the cache's dtype) and its delta state (float32).
    num_linear_layers: int = 0
    linear_conv_elements: int = 0
    linear_delta_elements: int = 0

    @property
    def supported(self) -> bool:
        """Whether the engine has a class for this architecture."""
        return self.engine_architecture in supported_architectures()

    @property
    def has_kv_shape(self) -> bool:
        return None not in (self.num_layers, self.num_kv_heads, self.head_dim)

    def weights_bytes(self, itemsize: int, keeps_blocks: bool = True) -> int:
        """Resident bytes of the weights when loaded at a float dtype of `itemsize` bytes; `keeps_blocks`
        says whether quantized tensors stay in their blocks (the CPU in bfloat16) or are dequantized."""
        if keeps_blocks:
            return self.packed_bytes + self.num_float_parameters * itemsize
        return (self.num_parameters or 0) * itemsize


def read_model_info(path: str | Path) -> ModelInfo:
    """The `ModelInfo` of a .gguf file or a Hugging Face model folder, without loading weights.

    Raises MissingFileError when `path` does not exist, CorruptFileError when its header, config.json or a
    safetensors header cannot be read, ModelLoadError when it is neither a .gguf file nor a model folder.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise MissingFileError(f"{path} does not exist. It may have been moved or deleted; add it again.")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path} is not a .gguf file. Choose a .gguf file or a Hugging Face model folder.")
        stat = path.stat()
        info = _gguf_info(path.resolve(), stat.st_mtime_ns, stat.st_size)
        if info.engine_architecture is not None:
            from engine.loading.mmproj import paired_mmproj

            # Looked up outside the cache, keyed by the text file: a projector may be put beside it later.
            mmproj = paired_mmproj(path)
            if mmproj is not None:
                info = _with_tower(info, mmproj)
        # The card names the file as the user gave it (a link keeps its own name); the cache, its target.
        return info if info.path == path else replace(info, path=path, name=path.stem)
    return _folder_info(path)


def gguf_file_type_name(value: Any) -> str | None:
    """A GGUF `general.file_type` (llama.cpp's llama_ftype) as its usual name, e.g. 15 -> "Q4_K_M"."""
    if not isinstance(value, int):
        return None
    import gguf

    try:
        return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"file type {value}"


# ------------------------------------------------------------------------------------------------------ GGUF


@lru_cache(maxsize=64)
def _gguf_info(path: Path, mtime_ns: int, size: int) -> ModelInfo:
    # Keyed by modification time and size, so a file replaced on disk is read again.
    from engine.config.gguf import ARCHITECTURES, read_gguf_config
    from engine.gguf.file import GGUFFile

    file = GGUFFile.open(path)  # maps the file and parses the header; tensor data is never touched
    arch = file.architecture
    metadata = file.metadata
    elements, packed_bytes, num_float = _tensor_totals(file)
    context = metadata.get(f"{arch}.context_length")
    config = None
    if arch in ARCHITECTURES:
        try:  # the loader's own reading of the metadata, so the card and the load agree on the shape
            config = read_gguf_config(file)
        except ModelLoadError:
            pass  # described as far as it can be; loading it names what is wrong
    return ModelInfo(
        path=path,
        name=path.stem,
        format="gguf",
        architecture=arch,
        engine_architecture=ARCHITECTURES.get(arch),
        size_bytes=size,
        num_parameters=sum(elements.values()),
        quantization=gguf_file_type_name(metadata.get("general.file_type")) or _dominant_type(elements),
        context_length=config.max_position_embeddings if config else (context if isinstance(context, int) else None),
        can_see_images=False,  # a GGUF vision model keeps its tower in an mmproj file: read_model_info looks
        **_kv_shape(config),
        packed_bytes=packed_bytes,
        num_float_parameters=num_float,
    )


def _tensor_totals(file: Any) -> tuple[Counter[str], int, int]:
    """(elements per tensor type name, bytes of block-quantized tensors, elements of float tensors)."""
    elements: Counter[str] = Counter()
    packed_bytes = num_float = 0
    for t in file.tensors:
        kind = t.tensor_type.name
        elements[kind] += int(t.n_elements)
        if kind in FLOAT_TYPES:
            num_float += int(t.n_elements)
        else:
            packed_bytes += int(t.n_bytes)
    return elements, packed_bytes, num_float


def _with_tower(info: ModelInfo, mmproj: Path) -> ModelInfo:
    """A text GGUF's card with the mmproj paired beside it: it sees images, and its size, parameters and
    weights' memory count the vision tower and projector too, so the memory check before loading does."""
    stat = mmproj.stat()
    elements, packed_bytes, num_float = _mmproj_totals(mmproj.resolve(), stat.st_mtime_ns, stat.st_size)
    return replace(
        info,
        can_see_images=True,
        size_bytes=info.size_bytes + stat.st_size,
        num_parameters=(info.num_parameters or 0) + sum(elements.values()),
        packed_bytes=info.packed_bytes + packed_bytes,
        num_float_parameters=info.num_float_parameters + num_float,
    )


@lru_cache(maxsize=16)
def _mmproj_totals(path: Path, mtime_ns: int, size: int) -> tuple[Counter[str], int, int]:
    from engine.gguf.file import GGUFFile

    return _tensor_totals(GGUFFile.open(path))


def _dominant_type(elements: Counter[str]) -> str | None:
    """The tensor type holding most weights: a file's quantization when its header leaves it out."""
    return elements.most_common(1)[0][0] if elements else None


# --------------------------------------------------------------------------------------------------- folders


def _folder_info(path: Path) -> ModelInfo:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(
            f"{path} has no config.json, so it is not a Hugging Face model folder. "
            "Choose the folder that holds config.json and the .safetensors files, or a .gguf file."
        )
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptFileError(f"{config_file} cannot be read as JSON ({e}); download the model again.") from None
    if not isinstance(raw, dict):
        raise CorruptFileError(f"{config_file} does not hold a JSON object; download the model again.")
    archs = raw.get("architectures") or [raw.get("model_type") or "unknown"]
    arch = str(archs[0])
    try:  # the loader's own parse (family defaults, text_config of a vision-language model)
        config = ModelConfig.from_hf_dict(raw, architecture=arch)
    except ModelLoadError:
        config = None
    # Vision-language configs keep the language model's settings in text_config.
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    context = raw.get("max_position_embeddings", text.get("max_position_embeddings"))
    dtype = raw.get("torch_dtype") or raw.get("dtype") or text.get("torch_dtype") or text.get("dtype")
    shards, num_parameters = _safetensors_parameters(path)
    return ModelInfo(
        path=path,
        name=path.name,
        format="huggingface",
        architecture=arch,
        engine_architecture=arch,
        size_bytes=sum(shard.stat().st_size for shard in shards),
        num_parameters=num_parameters,
        quantization=dtype if isinstance(dtype, str) else None,
        context_length=config.max_position_embeddings if config else (context if isinstance(context, int) else None),
        can_see_images=arch in vision_architectures(),
        **_kv_shape(config),
        num_float_parameters=num_parameters or 0,
        checkpoint_dtype=dtype if isinstance(dtype, str) else None,
    )


def _safetensors_parameters(folder: Path) -> tuple[list[Path], int | None]:
    """(the weight files, the elements of every tensor in them) from the safetensors headers alone.

    A safetensors file starts with an 8-byte little-endian header length and a JSON header giving each
    tensor's dtype, shape and byte range. No weights: ([], None), which loading reports in its own words.
    """
    from engine.loading.safetensors import _shards  # the loader's rule for which files hold the weights

    try:
        shards = _shards(folder)
    except MissingFileError:
        return [], None
    total = 0
    for shard in shards:
        try:
            with open(shard, "rb") as f:
                length = int.from_bytes(f.read(8), "little")
                if not 2 <= length <= shard.stat().st_size - 8:
                    raise ValueError(f"a header of {length} bytes")
                header = json.loads(f.read(length))
            total += sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptFileError(
                f"{shard} has no readable safetensors header ({type(e).__name__}: {e}). Download it again."
            ) from None
    return shards, total


def _kv_shape(config: ModelConfig | None) -> dict[str, int | None]:
    if config is None:
        return {"num_layers": None, "num_kv_heads": None, "head_dim": None}
    return {
        "num_layers": config.num_hidden_layers,
        "num_kv_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        **_sliding(config),
        **_linear(config),
    }


def _linear(config: ModelConfig) -> dict[str, int]:
    """How many layers keep a recurrent state instead of pages, and its size, as the model's layers will be built."""
    if "Qwen3_5" not in (config.text_architecture or config.architecture):
        return {}
    from engine.models.qwen3_5 import Qwen3_5Settings

    try:
        s = Qwen3_5Settings.from_config(config)
    except ModelLoadError:
        return {}
    conv_dim = 2 * s.num_k_heads * s.key_dim + s.num_v_heads * s.value_dim  # q, k and v go through the conv
    return {
        "num_linear_layers": sum(s.is_linear),
        "linear_conv_elements": conv_dim * (s.conv_kernel - 1),
        "linear_delta_elements": s.num_v_heads * s.key_dim * s.value_dim,
    }


def _sliding(config: ModelConfig) -> dict[str, int | None]:
    """How many layers use a sliding window, and its size, as the model's layers will be built."""
    if "Gemma3" in (config.text_architecture or config.architecture):
        from engine.models.gemma3.text import Gemma3TextSettings

        extra = config.extra.get("text_config") if isinstance(config.extra.get("text_config"), dict) else config.extra
        try:
            settings = Gemma3TextSettings.from_hf_dict(extra, config.num_hidden_layers)
        except ModelLoadError:
            return {}
        if settings.sliding_window:
            return {"num_sliding_layers": sum(settings.is_sliding), "sliding_window": settings.sliding_window}
        return {}
    types = config.extra.get("layer_types")
    if config.sliding_window and isinstance(types, list) and len(types) == config.num_hidden_layers:
        # gpt-oss and other families that name each layer's kind
        return {"num_sliding_layers": types.count("sliding_attention"), "sliding_window": config.sliding_window}
    if config.sliding_window:
        return {"num_sliding_layers": config.num_hidden_layers, "sliding_window": config.sliding_window}
    return {}


__all__ = ["FLOAT_TYPES", "ModelInfo", "gguf_file_type_name", "read_model_info"]
