"""How much memory a model needs at a context, and the refusal when that is more than is free.

    need = weights resident + KV cache for one chat at the context + a fixed working overhead
    weights: GGUF blocks stay packed (about the file size); float tensors take the compute dtype's size
    KV cache: 2 (keys, values) * layers * kv_heads * head_dim * tokens * bytes per element

Checking this before a load turns "the machine swaps for minutes, then the app dies" into a message that says
what to change. The figures are estimates: good to a few percent for the weights and exact for the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelLoadError
from engine.model_info import ModelInfo

# Memory a loaded model uses beyond weights and cache: activations of a prompt chunk, logits, kernel scratch
# buffers, tokenizer tables; what a loaded 1B model holds above file size + cache, with room to spare.
OVERHEAD_BYTES = 256 * 2**20
CONTEXT_STEP = 256  # contexts offered in place of one that does not fit are whole cache pages


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Bytes one token takes in the KV cache: keys and values of every layer."""
    return 2 * num_layers * num_kv_heads * head_dim * itemsize


@dataclass(frozen=True)
class MemoryNeed:
    """What loading a model and holding one chat of `context_tokens` takes, in bytes."""

    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    context_tokens: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes


def memory_need(info: ModelInfo, context_tokens: int, itemsize: int, keeps_blocks: bool = True) -> MemoryNeed:
    """The memory `info`'s model needs with a cache of `context_tokens` tokens in a dtype of `itemsize` bytes.

    `keeps_blocks`: quantized GGUF tensors stay in their blocks (see ModelInfo.weights_bytes). A model whose
    KV shape is unknown counts weights and overhead only.
    """
    per_token = _per_token(info, itemsize)
    return MemoryNeed(
        weights_bytes=info.weights_bytes(itemsize, keeps_blocks),
        kv_bytes=per_token * context_tokens,
        overhead_bytes=OVERHEAD_BYTES,
        context_tokens=context_tokens,
    )


def largest_context(info: ModelInfo, free_bytes: int, itemsize: int, keeps_blocks: bool = True) -> int:
    """The longest context (whole CONTEXT_STEPs, at most the model's own) that fits in `free_bytes`; 0 when
    not even one step does."""
    per_token = _per_token(info, itemsize)
    room = free_bytes - memory_need(info, 0, itemsize, keeps_blocks).total_bytes
    if room < per_token * CONTEXT_STEP:
        return 0
    tokens = room // per_token if per_token else info.context_length or CONTEXT_STEP
    if info.context_length:
        tokens = min(tokens, info.context_length)
    return max(CONTEXT_STEP, tokens // CONTEXT_STEP * CONTEXT_STEP)


class NotEnoughMemoryError(ModelLoadError):
    """A model would not fit in the free memory at the chosen context; raised before any weight is read.

    `fitting_context` is the longest context that does fit (0: none does).
    """

    def __init__(self, path: Path, need: MemoryNeed, free_bytes: int, fitting_context: int):
        self.path, self.need, self.free_bytes, self.fitting_context = path, need, free_bytes, fitting_context
        choices = "pick a smaller context, or" if fitting_context else "or pick"
        message = (
            f"{path.name} needs about {format_bytes(need.total_bytes)} at a {need.context_tokens:,}-token context "
            f"but {format_bytes(free_bytes)} is free. Close other programs, {choices} a smaller quantization or model."
        )
        if fitting_context:
            message += f" It fits with a context of up to {fitting_context:,} tokens."
        super().__init__(message)


def check_memory(
    info: ModelInfo, context_tokens: int, free_bytes: int | None, itemsize: int, keeps_blocks: bool = True
) -> MemoryNeed:
    """`memory_need(...)`, or NotEnoughMemoryError when it is more than `free_bytes` (None: not known, so
    nothing is refused)."""
    need = memory_need(info, context_tokens, itemsize, keeps_blocks)
    if free_bytes is not None and need.total_bytes > free_bytes:
        fitting = largest_context(info, free_bytes, itemsize, keeps_blocks)
        raise NotEnoughMemoryError(info.path, need, free_bytes, fitting if fitting < context_tokens else 0)
    return need


def format_bytes(num_bytes: int) -> str:
    """Sizes as people read them in a file manager: "6.1 GB", "812 MB", "96 KB" (powers of 1000)."""
    if num_bytes >= 950_000_000:
        return f"{num_bytes / 1e9:.1f} GB"
    if num_bytes >= 950_000:
        return f"{num_bytes / 1e6:.0f} MB"
    return f"{max(1, round(num_bytes / 1e3))} KB"


def _per_token(info: ModelInfo, itemsize: int) -> int:
    if not info.has_kv_shape:
        return 0
    return kv_bytes_per_token(info.num_layers, info.num_kv_heads, info.head_dim, itemsize)


__all__ = [
    "CONTEXT_STEP",
    "OVERHEAD_BYTES",
    "MemoryNeed",
    "NotEnoughMemoryError",
    "check_memory",
    "format_bytes",
    "kv_bytes_per_token",
    "largest_context",
    "memory_need",
]
