"""KV tensors laid out in pages. This file holds memory only; page allocation lives in the page table."""

from __future__ import annotations

import torch

from engine.config import ModelConfig


class Cache:
    """The paged KV store shared by all jobs of one generator.

    Per layer, keys and values are `[num_pages, page_size, num_kv_heads, head_dim]`. `max_seq_len` is the
    total token budget across all jobs and must be a multiple of `page_size`.
    """

    def __init__(self, model, max_seq_len: int, page_size: int = 256, dtype: torch.dtype | None = None):
        if page_size <= 0 or max_seq_len <= 0:
            raise ValueError(f"page_size ({page_size}) and max_seq_len ({max_seq_len}) must be positive")
        if max_seq_len % page_size:
            raise ValueError(
                f"max_seq_len ({max_seq_len}) must be a multiple of page_size ({page_size}); "
                f"use {((max_seq_len + page_size - 1) // page_size) * page_size}"
            )
        config: ModelConfig = model.config
        self.model = model
        self.page_size = page_size
        self.max_seq_len = max_seq_len
        self.num_pages = max_seq_len // page_size
        self.dtype = dtype or model.dtype
        self.device = model.device
        shape = (self.num_pages, page_size, config.num_key_value_heads, config.head_dim)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(config.num_hidden_layers)]

    def copy_page(self, src: int, dst: int, num_tokens: int | None = None) -> None:
        """Copy the first `num_tokens` rows (all by default) of page `src` into page `dst` on every layer."""
        n = self.page_size if num_tokens is None else num_tokens
        for k, v in zip(self.k, self.v):
            k[dst, :n].copy_(k[src, :n])
            v[dst, :n].copy_(v[src, :n])

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
