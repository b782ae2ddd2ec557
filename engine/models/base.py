"""The common shape of every text model: construction from a config, weight mapping, and `forward`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from engine.config.model import ModelConfig
from engine.errors import TensorMismatchError
from engine.memory import release_freed_memory
from engine.models.batch import Batch
from engine.models.embedding import Embedding
from engine.models.linear import BlockWeight, Linear, QuantizedWeight, SplitWeight

log = logging.getLogger(__name__)


class Model(nn.Module):
    """A causal language model over a paged KV cache.

    `Model.load(path)` reads a Hugging Face folder or a GGUF file and returns the right subclass.
    `forward(inputs, positions, batch)` takes token ids [num_tokens] (or embeddings [num_tokens, hidden])
    for a ragged batch and returns float32 logits for the rows `batch.logits_indices` names.
    """

    architectures: ClassVar[tuple[str, ...]] = ()
    # engine/loading/model.py's load_model, set when it is imported (engine/__init__.py does): loading sits above
    # the models (it builds them), so the models do not import it
    _loader: ClassVar[Callable[..., Model] | None] = None

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.source_path: Path | None = None
        # Why a GGUF loaded without the images its mmproj offered (unsupported projector, a mismatch), for the
        # app to show; None when there was no mmproj or it paired.
        self.vision_error: str | None = None
        self._tokenizer = None

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        progress: Callable[[float], None] | None = None,
        quantized: str | None = "auto",
        mmproj: str | Path | None = None,
    ) -> Model:
        """Load a model folder or .gguf file; `progress(fraction)` is called as tensors load.

        `quantized` applies to GGUF files: "int4" keeps Q4_0 / Q4_1 projection weights packed 4-bit (read
        directly by the matmul), None dequantizes every tensor to `dtype`, and "auto" means "int4" for
        bfloat16 on CPU and None otherwise. Safetensors folders are always loaded as float.

        `mmproj` pairs a text .gguf with llama.cpp's projector file, for a vision model; without it, the one
        `mmproj*.gguf` beside the text file is used. A projector Tandem cannot pair leaves the text model
        text-only, with the reason in `model.vision_error`.
        """
        if Model._loader is None:
            raise RuntimeError("no model loader registered: import engine (engine/loading/model.py registers it)")
        return Model._loader(path, device=device, dtype=dtype, progress=progress, quantized=quantized, mmproj=mmproj)

    @property
    def tokenizer(self):
        """The model's tokenizer, loaded from the same files on first use."""
        if self._tokenizer is None:
            from engine.tokenizer.tokenizer import Tokenizer

            if self.source_path is None:
                raise AttributeError("this model was not loaded from files, so it has no tokenizer")
            self._tokenizer = Tokenizer.load(self.source_path)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value) -> None:
        self._tokenizer = value

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    # --- weights -------------------------------------------------------------------------------------

    def checkpoint_names(self, name: str) -> tuple[str, ...]:
        """The checkpoint tensors that make up parameter `name`, concatenated on dim 0. Identity by default."""
        return (name,)

    def load_tensors(self, tensors: dict[str, torch.Tensor | QuantizedWeight | SplitWeight | BlockWeight]) -> None:
        """Fill this (meta-device) model from checkpoint-named tensors, checking every name and shape.

        A `QuantizedWeight` (4-bit GGUF blocks) or `SplitWeight` (8-bit ones) is packed into its `Linear` when
        every part of the parameter is one with the same group size; anywhere else it is dequantized to a float
        weight. A packed "lm_head.weight" beside tied embeddings gives the head its own packed copy. A
        `BlockWeight` (GGUF K-quant blocks) stays in its blocks in a `Linear` or an `Embedding` that can hold it.
        Checkpoint tensors joined into one parameter (q, k, v) leave `tensors` as they are joined.
        """
        state: dict[str, torch.Tensor] = {}
        quantized: dict[str, QuantizedWeight | SplitWeight | BlockWeight] = {}
        for name, param in self.named_parameters(remove_duplicate=False):
            if name in state or name in quantized:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings and name not in tensors:
                continue  # tied: the head reads the embedding matrix (unless the loader gave it its own form)
            parts = []
            for src in self.checkpoint_names(name):
                if src not in tensors:
                    raise TensorMismatchError(
                        f"the checkpoint has no tensor {src!r} (needed for {self.config.architecture}). "
                        "The checkpoint is incomplete or is not of this architecture."
                    )
                part = tensors[src]
                _check_part(src, part, param, joined=len(self.checkpoint_names(name)) > 1)
                parts.append(part)
            value = combine_parts(parts, self.get_submodule(name.rsplit(".", 1)[0]) if "." in name else self)
            if len(parts) > 1:  # joined into a new tensor: drop the parts, or the load's peak holds both copies
                for src in self.checkpoint_names(name):
                    del tensors[src]
            del parts
            if tuple(value.shape) != tuple(param.shape):
                raise TensorMismatchError(
                    f"tensor {' + '.join(self.checkpoint_names(name))} has shape {tuple(value.shape)} but the "
                    f"config implies {tuple(param.shape)}. config.json and the weights do not belong together."
                )
            if isinstance(value, PACKED):
                quantized[name] = value
            else:
                state[name] = value
        self.load_state_dict(state, strict=False, assign=True)
        for name, value in quantized.items():
            load_packed(self, name, value)
            # packing's temporaries, trimmed after every weight: trimming after large ones only leaves the load's
            # peak to chance (which heaps the freed blocks sat in; engine/memory.py)
            release_freed_memory()
        if self.config.tie_word_embeddings:
            self.tie_weights()
        missing = [n for n, p in self.named_parameters() if p.is_meta]
        if missing:
            raise TensorMismatchError(f"no weights were found for {missing[:5]}; the checkpoint is incomplete.")

    def tie_weights(self) -> None:
        raise NotImplementedError

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, batch: Batch) -> torch.Tensor:
        raise NotImplementedError


def _check_part(name: str, part, param: torch.Tensor, joined: bool) -> None:
    """A checkpoint tensor must be floating point, and one joined into a wider parameter (q, k and v; gate and
    up) must match it past the first dimension: otherwise the join fails with torch's own message, naming
    neither tensor."""
    if isinstance(part, torch.Tensor) and not part.is_floating_point():
        raise TensorMismatchError(
            f"tensor {name!r} holds {part.dtype} values, but a weight must hold floating-point numbers. "
            "The checkpoint is damaged or not a model's weights; download it again."
        )
    shape = tuple(getattr(part, "shape", ()))
    if joined and (len(shape) != param.dim() or shape[1:] != tuple(param.shape[1:])):
        raise TensorMismatchError(
            f"tensor {name!r} has shape {shape}, but the config implies (..., {', '.join(map(str, param.shape[1:]))}) "
            f"for {param.dim()} dimensions. config.json and the weights do not belong together."
        )


PACKED = (QuantizedWeight, SplitWeight, BlockWeight)  # GGUF weights kept in their blocks (engine/models/linear.py)


def load_packed(root: nn.Module, name: str, value: QuantizedWeight | SplitWeight | BlockWeight) -> None:
    """Install packed weight `value` as parameter `name` of `root`: its `Linear` (or `Embedding`) trades the
    float weight for the blocks' buffers."""
    module = root.get_submodule(name.rpartition(".")[0])
    if isinstance(value, BlockWeight):
        module.load_blocks(value)
    else:
        module.load_quantized(value, device=value.device)


def combine_parts(parts: list[torch.Tensor | QuantizedWeight], module: nn.Module) -> torch.Tensor | QuantizedWeight:
    """Concatenate checkpoint tensors on dim 0, keeping them quantized only where `module` can hold that (the
    text models' loading here, the vision towers' in engine/vision/layers.py)."""
    kinds = {type(p) for p in parts}
    packed_kinds = set(PACKED)
    keep_quantized = (
        len(kinds) == 1
        and len({(p.group_size, p.shape[1]) for p in parts if type(p) in packed_kinds}) == 1
        and (
            (isinstance(module, Linear) and kinds <= packed_kinds)
            or (isinstance(module, Embedding) and kinds == {BlockWeight})
        )
    )
    if keep_quantized:
        return parts[0] if len(parts) == 1 else parts[0].cat(parts)
    parts = [p.dequantize() if type(p) in packed_kinds else p for p in parts]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
