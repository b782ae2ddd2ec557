"""How much memory a model needs at a context, and the refusal when that is more than is free.

    need = weights resident + KV cache for one chat at the context + a fixed working overhead
    weights: GGUF blocks stay packed (about the file size); float tensors take the compute dtype's size
    KV cache: 2 (keys, values) * layers * kv_heads * tokens * bytes of one head row, where a row is
              head_dim * bytes per element ("bf16": the model's dtype) or, in a quantized format (q8, q6, q4),
              head_dim / 32 blocks of a float16 scale and 32 codes (kernels/torch_ref/kv_quant.py); a
              sliding-window layer counts only the tokens of its window pool (engine/cache/cache.py); a
              linear-attention layer keeps no K/V but a recurrent state per slot of the cache's default pool
              (STATE_SEQS running sequences and SNAPSHOTS_PER_SEQ snapshots each, engine/cache/recurrent.py)

Checking this before a load turns "the machine swaps for minutes, then the app dies" into a message that says
what to change. The figures are estimates: good to a few percent for the weights and exact for the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.cache.cache import KV_FORMATS, SNAPSHOTS_PER_SEQ, STATE_SEQS, window_pool_tokens
from engine.cache.recurrent import state_bytes
from engine.errors import ModelLoadError
from engine.model_info import ModelInfo
from kernels.torch_ref import kv_quant

# Memory a loaded model uses beyond weights and cache: activations of a prompt chunk, logits, kernel scratch
# buffers, tokenizer tables; what a loaded 1B model holds above file size + cache, with room to spare.
OVERHEAD_BYTES = 256 * 2**20
CONTEXT_STEP = 256  # contexts offered in place of one that does not fit are whole cache pages


def kv_format_problem(head_dim: int | None, kv_format: str) -> str | None:
    """Why a model with heads of `head_dim` values cannot keep its KV cache in `kv_format`; None when it can (or
    when `head_dim` is not known: the Cache says so then)."""
    if kv_format not in KV_FORMATS:
        return f"the KV cache format {kv_format!r} is not one of {', '.join(KV_FORMATS)}"
    if kv_format != "bf16" and head_dim is not None and head_dim % kv_quant.GROUP:
        return (
            f"a {kv_format.upper()} cache packs each head's values in blocks of {kv_quant.GROUP}, and this model's "
            f"heads have {head_dim}: use full precision (bf16)"
        )
    return None


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int, kv_format: str = "bf16"
) -> int:
    """Bytes one token takes in the KV cache: keys and values of every layer, exactly what engine.cache.Cache
    allocates. `itemsize`: the float cache's bytes per element ("bf16" is the model's dtype, whatever it is); a
    quantized format's rows count their scales. Raises ValueError for a format the heads cannot take."""
    problem = kv_format_problem(head_dim, kv_format)
    if problem is not None:
        raise ValueError(problem)
    if kv_format == "bf16":
        return 2 * num_layers * num_kv_heads * head_dim * itemsize
    return 2 * num_layers * num_kv_heads * kv_quant.row_bytes(head_dim, kv_quant.FORMATS[kv_format])


@dataclass(frozen=True)
class MemoryNeed:
    """What loading a model and holding one chat of `context_tokens` takes, in bytes."""

    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    context_tokens: int
    kv_format: str = "bf16"

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes


def memory_need(
    info: ModelInfo, context_tokens: int, itemsize: int, keeps_blocks: bool = True, kv_format: str = "bf16"
) -> MemoryNeed:
    """The memory `info`'s model needs with a cache of `context_tokens` tokens in `kv_format` ("bf16": a dtype
    of `itemsize` bytes, the weights' compute dtype).

    `keeps_blocks`: quantized GGUF tensors stay in their blocks (see ModelInfo.weights_bytes). A model whose
    KV shape is unknown counts weights and overhead only.
    """
    return MemoryNeed(
        weights_bytes=info.weights_bytes(itemsize, keeps_blocks),
        kv_bytes=_kv_bytes(info, context_tokens, itemsize, kv_format),
        overhead_bytes=OVERHEAD_BYTES,
        context_tokens=context_tokens,
        kv_format=kv_format,
    )


def largest_context(
    info: ModelInfo, free_bytes: int, itemsize: int, keeps_blocks: bool = True, kv_format: str = "bf16"
) -> int:
    """The longest context (whole CONTEXT_STEPs, at most the model's own) that fits in `free_bytes` with a cache
    in `kv_format`; 0 when not even one step does."""
    room = free_bytes - memory_need(info, 0, itemsize, keeps_blocks, kv_format).total_bytes
    if not info.has_kv_shape:  # the cache cannot be sized: the weights alone decide
        return (info.context_length or CONTEXT_STEP) if room >= 0 else 0
    if room < _kv_bytes(info, CONTEXT_STEP, itemsize, kv_format):
        return 0
    limit = info.context_length or 2**24  # tokens; a model that does not say is searched up to this
    # the cache grows with the context (no faster than linearly): the longest context whose cache fits the room
    low, high = 1, max(limit // CONTEXT_STEP, 1)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if _kv_bytes(info, mid * CONTEXT_STEP, itemsize, kv_format) <= room else (low, mid - 1)
    return low * CONTEXT_STEP


class NotEnoughMemoryError(ModelLoadError):
    """A model would not fit in the free memory at the chosen context; raised before any weight is read.

    `fitting_context` is the longest context that does fit (0: none does); `hint`, a sentence added to the
    message (another way to make room).
    """

    def __init__(self, path: Path, need: MemoryNeed, free_bytes: int, fitting_context: int, hint: str = ""):
        self.path, self.need, self.free_bytes, self.fitting_context = path, need, free_bytes, fitting_context
        choices = "pick a smaller context, or" if fitting_context else "or pick"
        message = (
            f"{path.name} needs about {format_bytes(need.total_bytes)} at a {need.context_tokens:,}-token context "
            f"but {format_bytes(free_bytes)} is free. Close other programs, {choices} a smaller quantization or model."
        )
        if fitting_context:
            message += f" It fits with a context of up to {fitting_context:,} tokens."
        if hint:
            message += f" {hint}"
        super().__init__(message)


def check_memory(
    info: ModelInfo,
    context_tokens: int,
    free_bytes: int | None,
    itemsize: int,
    keeps_blocks: bool = True,
    kv_format: str = "bf16",
) -> MemoryNeed:
    """`memory_need(...)`, or NotEnoughMemoryError when it is more than `free_bytes` (None: not known, so
    nothing is refused)."""
    need = memory_need(info, context_tokens, itemsize, keeps_blocks, kv_format)
    if free_bytes is not None and need.total_bytes > free_bytes:
        fitting = largest_context(info, free_bytes, itemsize, keeps_blocks, kv_format)
        hint = ""
        if need.kv_bytes and kv_format == "bf16" and kv_format_problem(info.head_dim, "q8") is None:
            smaller = largest_context(info, free_bytes, itemsize, keeps_blocks, "q8")
            if smaller > fitting:  # the cache is what does not fit: a format of half its size makes room
                hint = f"With the Q8 cache format it fits with a context of up to {smaller:,} tokens."
        raise NotEnoughMemoryError(info.path, need, free_bytes, fitting if fitting < context_tokens else 0, hint)
    return need


def format_bytes(num_bytes: int) -> str:
    """Sizes as people read them in a file manager: "6.1 GB", "812 MB", "96 KB" (powers of 1000)."""
    if num_bytes >= 950_000_000:
        return f"{num_bytes / 1e9:.1f} GB"
    if num_bytes >= 950_000:
        return f"{num_bytes / 1e6:.0f} MB"
    return f"{max(1, round(num_bytes / 1e3))} KB"


def recurrent_state_bytes(info: ModelInfo, itemsize: int) -> int:
    """The recurrent-state pool a Cache gives a hybrid model by default: its live slots and snapshot slots, each
    holding every linear-attention layer's state (the conv window at `itemsize` bytes, the delta state float32)."""
    if not info.num_linear_layers:
        return 0
    per_slot = info.num_linear_layers * state_bytes(info.linear_conv_elements, info.linear_delta_elements, itemsize)
    return per_slot * STATE_SEQS * (1 + SNAPSHOTS_PER_SEQ)


def _kv_bytes(info: ModelInfo, tokens: int, itemsize: int, kv_format: str) -> int:
    """The cache of one chat of `tokens` tokens: every token on full layers, the window pool on sliding ones, the
    state pool for linear-attention ones."""
    if not info.has_kv_shape:
        return 0
    per_layer = kv_bytes_per_token(1, info.num_kv_heads, info.head_dim, itemsize, kv_format)
    sliding = info.num_sliding_layers if info.sliding_window else 0
    kept = window_pool_tokens(info.sliding_window, CONTEXT_STEP, tokens) if sliding else 0
    full = info.num_layers - sliding - info.num_linear_layers
    return per_layer * (full * tokens + sliding * kept) + recurrent_state_bytes(info, itemsize)


__all__ = [
    "CONTEXT_STEP",
    "OVERHEAD_BYTES",
    "MemoryNeed",
    "NotEnoughMemoryError",
    "check_memory",
    "format_bytes",
    "kv_bytes_per_token",
    "kv_format_problem",
    "largest_context",
    "memory_need",
    "recurrent_state_bytes",
]
