"""KV tensors laid out in pages. This file holds memory only; page allocation lives in the page table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from engine.cache.disk import DEFAULT_MAX_BYTES, DiskTier, model_identity
from engine.config.model import ModelConfig
from kernels.torch_ref import kv_quant

KV_FORMATS = ("bf16", *kv_quant.FORMATS)  # what `kv_format` takes ("bf16": the model's dtype, unquantized)


class Cache:
    """The paged KV store shared by all jobs of one generator.

    Per layer, keys and values are `[num_pages, page_size, num_kv_heads, head_dim]` (possibly a strided view,
    see `_layer_tensor`). `max_seq_len` is the
    total token budget across all jobs and must be a multiple of `page_size`.

    `kv_format`: "bf16" (the default: pages in `dtype`, the model's own unless given) or "q8", "q6", "q4": pages
    of 8-, 6- or 4-bit codes with a float16 scale per 32 values (kernels/torch_ref/kv_quant.py), about 0.53x,
    0.41x and 0.28x the bytes of bfloat16. Attention still computes in `dtype`; the page tensors are then uint8
    rows of `kv_quant.row_bytes` bytes per head.

    `disk_dir`: also keep finished pages in that folder (at most `disk_max_bytes`), so a later process with the
    same model reads a long prefix back instead of computing it (see disk.py).
    """

    def __init__(
        self,
        model,
        max_seq_len: int,
        page_size: int = 256,
        dtype: torch.dtype | None = None,
        kv_format: str = "bf16",
        disk_dir: str | Path | None = None,
        disk_max_bytes: int = DEFAULT_MAX_BYTES,
    ):
        if page_size <= 0 or max_seq_len <= 0:
            raise ValueError(f"page_size ({page_size}) and max_seq_len ({max_seq_len}) must be positive")
        if max_seq_len % page_size:
            raise ValueError(
                f"max_seq_len ({max_seq_len}) must be a multiple of page_size ({page_size}); "
                f"use {((max_seq_len + page_size - 1) // page_size) * page_size}"
            )
        config: ModelConfig = model.config
        if kv_format not in KV_FORMATS:
            raise ValueError(f"kv_format {kv_format!r} is not one of {', '.join(KV_FORMATS)}")
        if kv_format != "bf16" and config.head_dim % kv_quant.GROUP:
            raise ValueError(
                f"a {kv_format} cache needs a head size that is a multiple of {kv_quant.GROUP}; this model's is "
                f"{config.head_dim}: use kv_format='bf16'"
            )
        self.kv_format = kv_format
        self.model = model
        self.page_size = page_size
        self.max_seq_len = max_seq_len
        self.num_pages = max_seq_len // page_size
        self.dtype = dtype or model.dtype
        self.device = model.device
        self.k = [self._layer_tensor(config) for _ in range(config.num_hidden_layers)]
        self.v = [self._layer_tensor(config) for _ in range(config.num_hidden_layers)]
        self.disk: DiskTier | None = None
        if disk_dir is not None:
            self.use_disk(disk_dir, disk_max_bytes)

    def use_disk(self, folder: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> DiskTier:
        """Keep finished pages in `folder` too (call before creating the generator, which reads `self.disk`)."""
        config: ModelConfig = self.model.config
        layout = tuple(self.k[0].shape)
        layout = (config.num_hidden_layers, *layout[1:])
        identity = model_identity(self.model, self.page_size, self.dtype, self.kv_format)
        self.disk = DiskTier(folder, identity, layout, self.k[0].dtype, max_bytes=max_bytes)
        return self.disk

    def _layer_tensor(self, config: ModelConfig) -> torch.Tensor:
        """One layer's keys or values, shape [num_pages, page_size, num_kv_heads, head_dim] in every case.

        On the CPU the memory underneath is head-major ([num_pages, num_kv_heads, page_size, head_dim], the
        tensor a permuted view of it): decode attention there multiplies each head's page as one contiguous
        matrix, and copying pages into that order on every step cost a tenth of a 16-job decode step. GPU
        kernels index any strides but want each slot's heads contiguous, so elsewhere the layout is plain.
        """
        heads, dim, dtype = config.num_key_value_heads, config.head_dim, self.dtype
        if self.kv_format != "bf16":
            dim, dtype = kv_quant.row_bytes(dim, kv_quant.FORMATS[self.kv_format]), torch.uint8
        if self.device.type == "cpu":
            memory = torch.zeros((self.num_pages, heads, self.page_size, dim), dtype=dtype, device=self.device)
            return memory.permute(0, 2, 1, 3)
        return torch.zeros((self.num_pages, self.page_size, heads, dim), dtype=dtype, device=self.device)

    def copy_page(self, src: int, dst: int, num_tokens: int | None = None) -> None:
        """Copy the first `num_tokens` rows (all by default) of page `src` into page `dst` on every layer."""
        n = self.page_size if num_tokens is None else num_tokens
        for k, v in zip(self.k, self.v):
            k[dst, :n].copy_(k[src, :n])
            v[dst, :n].copy_(v[src, :n])

    def save_page(self, page_id: int, page_hash: int, prev_hash: int, token_ids: Sequence[int]) -> None:
        """Queue a full, named page for the disk tier (a private copy of its rows; the write happens later)."""
        if self.disk is None:
            return
        rows = [t[page_id].clone() for pair in zip(self.k, self.v) for t in pair]  # [page_size, heads, head_dim]
        self.disk.write(page_hash, prev_hash, token_ids, rows)

    def load_page(self, page_id: int, page_hash: int, prev_hash: int, token_ids: Sequence[int]) -> bool:
        """Fill page `page_id` from the disk tier; False when it has no valid copy (then compute the page)."""
        rows = self.disk.read(page_hash, prev_hash, token_ids) if self.disk is not None else None
        if rows is None:
            return False
        layers = [t for pair in zip(self.k, self.v) for t in pair]
        for dst, src in zip(layers, rows):
            dst[page_id].copy_(src)
        return True

    @property
    def num_bytes(self) -> int:
        """Every byte of the pages, quantized blocks' scales included."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def bytes_per_token(self) -> int:
        return self.num_bytes // self.max_seq_len
