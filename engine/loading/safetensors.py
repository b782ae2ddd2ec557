"""Read a Hugging Face folder's safetensors weights (single file or sharded with an index), memory-mapped."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import torch

from engine.errors import CorruptFileError, MissingFileError

log = logging.getLogger(__name__)


def _shards(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CorruptFileError(f"{index} is not a valid safetensors index ({e}). Re-download it.") from None
        if not isinstance(weight_map, dict) or not all(isinstance(n, str) for n in weight_map.values()):
            raise CorruptFileError(f"{index} is not a valid safetensors index (its weight_map must name files).")
        shards = [folder / name for name in dict.fromkeys(weight_map.values())]
        for name in dict.fromkeys(weight_map.values()):
            # An index is data from the download: a name like "../x.safetensors" or an absolute path must not
            # make the loader read a file outside the model's folder. Checked on the name, not the resolved
            # path: Hugging Face's cache links each file to a blob outside the snapshot folder.
            if PurePosixPath(name).is_absolute() or Path(name).is_absolute() or ".." in PurePosixPath(name).parts:
                raise CorruptFileError(
                    f"{index} names {name!r}, which is outside the model folder; an index may only name files "
                    "inside it. The folder is damaged or was made to mislead: download it again from its source."
                )
        for shard in shards:
            if not shard.is_file():
                raise MissingFileError(f"{index} lists {shard.name}, which is missing. Download the whole folder.")
        return shards
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise MissingFileError(
            f"{folder} has no .safetensors weights (looked for model.safetensors and an index). "
            "PyTorch .bin checkpoints are not read; convert them to safetensors or use a GGUF file."
        )
    return found


def load_safetensors(
    folder: str | Path,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    progress: Callable[[float], None] | None = None,
) -> dict[str, torch.Tensor]:
    """All tensors of the folder's safetensors files, converted to `dtype` on `device`, by checkpoint name."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    shards = _shards(folder)
    handles = []
    for shard in shards:
        try:
            handles.append(safe_open(shard, framework="pt", device="cpu"))
        except (SafetensorError, OSError, ValueError) as e:
            raise CorruptFileError(
                f"{shard} is not a readable safetensors file ({e}). It may be truncated; download it again."
            ) from None
    total = sum(len(h.keys()) for h in handles) or 1
    done = 0
    tensors: dict[str, torch.Tensor] = {}
    for shard, handle in zip(shards, handles):
        for name in handle.keys():
            try:
                t = handle.get_tensor(name)
            except (SafetensorError, OSError, ValueError, RuntimeError) as e:
                raise CorruptFileError(
                    f"{shard}: tensor {name!r} cannot be read ({e}). Download the file again."
                ) from None
            # Integer tensors (e.g. quantization metadata) keep their type; floats take the compute dtype.
            tensors[name] = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
            done += 1
            if progress is not None:
                progress(done / total)
    return tensors
