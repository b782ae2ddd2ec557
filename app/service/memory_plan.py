"""How the service sizes a load: the context it checks a model for, the dtype and layout its weights take,
the free memory it measures, and the tokens of KV cache it allocates.

The estimate itself (weights + one chat's KV cache + overhead, and the refusal) is engine.memory_fit; this
file adds what only the service knows: its device, its dtype and how many chats share the cache.
"""

from __future__ import annotations

import os

import torch

from engine.config.model import ModelConfig
from engine.loading.model import default_dtype, default_quantized, parse_dtype
from engine.memory_fit import (
    CONTEXT_STEP,
    OVERHEAD_BYTES,
    MemoryNeed,
    NotEnoughMemoryError,
    format_bytes,
    kv_format_problem,
)
from engine.memory_fit import kv_bytes_per_token as kv_cache_bytes_per_token
from engine.model_info import ModelInfo

PAGE_SIZE = 256
MAX_CACHE_TOKENS = 32768
# The context a load is checked for (and given room for) when none is chosen, at most the model's own.
DEFAULT_CONTEXT_TOKENS = 8192
# Share of the free memory (after the weights are in) that the KV cache may take.
CACHE_MEMORY_SHARE = 0.25
# Chats that fit in the cache at the model's full context: the cache serves this many long chats at once.
CONCURRENT_CHATS = 4


def checked_context(info: ModelInfo, context_length: int | None) -> int:
    """The context a load is checked for: the one asked for (DEFAULT_CONTEXT_TOKENS when None), at most the
    model's own."""
    wanted = context_length or DEFAULT_CONTEXT_TOKENS
    return min(wanted, info.context_length) if info.context_length else wanted


def weight_layout(info: ModelInfo, device: torch.device, dtype: torch.dtype | str | None) -> tuple[int, bool]:
    """(bytes per float element, whether GGUF blocks stay packed): the choices engine.loading.model.load_model
    makes for `info` on `device` with `dtype` (None: the device's default)."""
    target = parse_dtype(dtype) or default_dtype(device, None if info.format == "gguf" else info.checkpoint_dtype)
    keeps_blocks = info.format == "gguf" and default_quantized(device, target) is not None
    return torch.empty((), dtype=target).element_size(), keeps_blocks


def plan_cache_tokens(
    context_length: int,
    bytes_per_token: int,
    free_bytes: int | None,
    page_size: int = PAGE_SIZE,
    max_tokens: int = MAX_CACHE_TOKENS,
    min_tokens: int = 0,
) -> int:
    """Tokens of KV cache to allocate: room for CONCURRENT_CHATS chats at full context, bounded by memory.

    min(context_length * 4, max_tokens), then at most CACHE_MEMORY_SHARE of `free_bytes`, rounded down
    to whole pages (at least one). In bfloat16, 32768 tokens take 0.75 GB for SmolLM2-135M and 4 GB for
    Llama-3-8B (a Q8 cache about half); several chats rarely all reach the full context, and pages are shared
    across turns. `min_tokens` (the one chat a load was checked for, at most `context_length`) are kept past
    that share and past `max_tokens` while they fit in `free_bytes` beside the working overhead, so the context
    chosen is the context given.
    """
    wanted = -(-min(min_tokens, context_length) // page_size) * page_size  # the one chat, in whole pages
    tokens = max(min(context_length * CONCURRENT_CHATS, max_tokens), wanted)
    if free_bytes is not None and bytes_per_token > 0:
        budget = int(free_bytes * CACHE_MEMORY_SHARE)
        floor = wanted * bytes_per_token
        if floor <= free_bytes - OVERHEAD_BYTES:
            budget = max(budget, floor)
        tokens = min(tokens, budget // bytes_per_token)
    return max(page_size, tokens // page_size * page_size)


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype, kv_format: str = "bf16") -> int:
    """Bytes one token takes in a Cache of `kv_format` for `config` ("bf16": pages in `dtype`), keys and values
    of every layer, quantized blocks' scales included: the Cache's own bytes_per_token."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    layers, heads, head_dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    return kv_cache_bytes_per_token(layers, heads, head_dim, itemsize, kv_format)


def free_memory_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on `device`, or None when the platform does not say."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:  # Linux: MemAvailable counts reclaimable page cache, unlike the sysconf free-page count
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


__all__ = [
    "CACHE_MEMORY_SHARE",
    "CONCURRENT_CHATS",
    "CONTEXT_STEP",  # the memory check's types and units, for the model card
    "DEFAULT_CONTEXT_TOKENS",
    "MAX_CACHE_TOKENS",
    "MemoryNeed",
    "NotEnoughMemoryError",
    "PAGE_SIZE",
    "checked_context",
    "format_bytes",
    "free_memory_bytes",
    "kv_bytes_per_token",
    "kv_format_problem",
    "plan_cache_tokens",
    "weight_layout",
]
