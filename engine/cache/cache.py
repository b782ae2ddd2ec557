"""KV tensors laid out in pages. This file holds memory only; page allocation lives in the page table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from engine.cache.disk import DEFAULT_MAX_BYTES, DiskTier, model_identity
from engine.cache.recurrent import RecurrentState, state_shapes
from engine.config.model import ModelConfig
from kernels.torch_ref import kv_quant

KV_FORMATS = ("bf16", *kv_quant.FORMATS)  # what `kv_format` takes ("bf16": the model's dtype, unquantized)
# The default sliding-window pool: this many jobs' windows, each with a prompt chunk of the generator's default
# size and two pages of slack (after its prompt a job needs only its window, so about twice as many decode).
WINDOW_JOBS, WINDOW_CHUNK = 4, 2048
# The default recurrent-state pool of a hybrid model: this many sequences run at once (more wait for a slot), and
# this many snapshots per such sequence (states at page boundaries, for prefix reuse and rewinds).
STATE_SEQS, SNAPSHOTS_PER_SEQ = 8, 2


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

    `sliding_tokens`: the tokens that layers attending to a sliding window (Gemma 3's local layers, Mistral's)
    keep across all jobs, in slots of one page that a job gives back once its window has moved past them
    (engine/cache/window.py). None sizes it for WINDOW_JOBS jobs' windows; `max_seq_len` or more keeps those
    layers in pages like the others. Models without such layers ignore it.

    `state_bytes`: the memory of the recurrent-state slots of a hybrid model's linear-attention layers (one slot per
    running sequence, engine/cache/recurrent.py; those layers keep no pages). None sizes it for STATE_SEQS
    sequences; too little for one sequence is an error. `snapshot_bytes`: more slots, for copies of the state at
    page boundaries, which let a later prompt with the same prefix (the next chat turn) and a rewind resume there;
    None gives SNAPSHOTS_PER_SEQ per live slot. Models without such layers ignore both.
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
        sliding_tokens: int | None = None,
        state_bytes: int | None = None,
        snapshot_bytes: int | None = None,
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
        self._place_windows(layer_windows(model, config.num_hidden_layers), sliding_tokens)
        self._place_states(model, config.num_hidden_layers, state_bytes, snapshot_bytes)
        sizes = [self.num_slots if i in self.window_layers else self.num_pages for i in range(config.num_hidden_layers)]
        sizes = [0 if i in self.state_layers else n for i, n in enumerate(sizes)]
        self.k = [self._layer_tensor(config, n) for n in sizes]
        self.v = [self._layer_tensor(config, n) for n in sizes]
        self.disk: DiskTier | None = None
        if disk_dir is not None:
            self.use_disk(disk_dir, disk_max_bytes)

    def _place_windows(self, windows: list[int | None], sliding_tokens: int | None) -> None:
        """Which layers live in window slots (`window_layers`), how many slots (`num_slots`), and the window."""
        self.window_layers: frozenset[int] = frozenset()
        self.num_slots = 0
        self.window = max((w for w in windows if w), default=None)
        if self.window is None:
            return
        if sliding_tokens is not None and sliding_tokens <= 0:
            raise ValueError(f"sliding_tokens must be positive, got {sliding_tokens}")
        pool = window_pool_tokens(self.window, self.page_size, self.max_seq_len, sliding_tokens)
        if pool < self.max_seq_len:
            self.num_slots = pool // self.page_size
            self.window_layers = frozenset(i for i, w in enumerate(windows) if w)

    def _place_states(self, model, num_layers: int, state_bytes: int | None, snapshot_bytes: int | None) -> None:
        """Which layers keep recurrent state instead of pages (`state_layers`), and their slot pool (`state`)."""
        shapes = state_shapes(model, num_layers)
        self.state_layers: frozenset[int] = frozenset(shapes)
        self.state: RecurrentState | None = None
        if shapes:
            per_slot = sum(s.num_bytes(self.dtype) for s in shapes.values())
            if state_bytes is None:
                state_bytes = STATE_SEQS * per_slot
            if snapshot_bytes is None:
                snapshot_bytes = SNAPSHOTS_PER_SEQ * (state_bytes // per_slot) * per_slot
            self.state = RecurrentState.for_budget(shapes, state_bytes, self.dtype, self.device, snapshot_bytes)

    def use_disk(self, folder: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> DiskTier:
        """Keep finished pages in `folder` too (call before creating the generator, which reads `self.disk`)."""
        config: ModelConfig = self.model.config
        layout = tuple(self.k[0].shape)
        layout = (config.num_hidden_layers, *layout[1:])
        identity = model_identity(self.model, self.page_size, self.dtype, self.kv_format)
        self.disk = DiskTier(folder, identity, layout, self.k[0].dtype, max_bytes=max_bytes)
        return self.disk

    def _layer_tensor(self, config: ModelConfig, num_pages: int) -> torch.Tensor:
        """One layer's keys or values, shape [num_pages, page_size, num_kv_heads, head_dim] in every case (the
        pages are window slots for a sliding-window layer kept apart).

        On the CPU the memory underneath is head-major ([num_pages, num_kv_heads, page_size, head_dim], the
        tensor a permuted view of it): decode attention there multiplies each head's page as one contiguous
        matrix, and copying pages into that order on every step cost a tenth of a 16-job decode step. GPU
        kernels index any strides but want each slot's heads contiguous, so elsewhere the layout is plain.
        """
        heads, dim, dtype = config.num_key_value_heads, config.head_dim, self.dtype
        if self.kv_format != "bf16":
            dim, dtype = kv_quant.row_bytes(dim, kv_quant.FORMATS[self.kv_format]), torch.uint8
        if self.device.type == "cpu":
            memory = torch.zeros((num_pages, heads, self.page_size, dim), dtype=dtype, device=self.device)
            return memory.permute(0, 2, 1, 3)
        return torch.zeros((num_pages, self.page_size, heads, dim), dtype=dtype, device=self.device)

    def _index(self, layer: int, page_id: int, slot: int | None) -> int | None:
        """Where layer `layer` keeps page `page_id`'s rows: the page, its window slot, or nowhere (None)."""
        if layer in self.state_layers:
            return None
        return slot if layer in self.window_layers else page_id

    def copy_page(
        self,
        src: int,
        dst: int,
        num_tokens: int | None = None,
        src_slot: int | None = None,
        dst_slot: int | None = None,
    ) -> None:
        """Copy the first `num_tokens` rows (all by default) of page `src` into page `dst` on every layer (of
        window slot `src_slot` into `dst_slot` on the sliding-window layers kept apart)."""
        n = self.page_size if num_tokens is None else num_tokens
        for layer, (k, v) in enumerate(zip(self.k, self.v)):
            a, b = self._index(layer, src, src_slot), self._index(layer, dst, dst_slot)
            if a is not None and b is not None:
                k[b, :n].copy_(k[a, :n])
                v[b, :n].copy_(v[a, :n])

    def save_page(
        self, page_id: int, page_hash: int, prev_hash: int, token_ids: Sequence[int], slot: int | None = None
    ) -> None:
        """Queue a full, named page for the disk tier (a private copy of its rows; the write happens later).
        `slot`: its window slot, which a cache with sliding-window layers kept apart needs to save it."""
        if self.disk is None or (self.window_layers and slot is None) or self.state is not None:
            return  # a hybrid model's page is of no use without its recurrent state, which disk does not keep yet
        rows = []  # [page_size, heads, head_dim] each, K then V per layer
        for layer, pair in enumerate(zip(self.k, self.v)):
            rows += [t[self._index(layer, page_id, slot)].clone() for t in pair]
        self.disk.write(page_hash, prev_hash, token_ids, rows)

    def load_page(
        self, page_id: int, page_hash: int, prev_hash: int, token_ids: Sequence[int], slot: int | None = None
    ) -> bool:
        """Fill page `page_id` (and window slot `slot`, if given) from the disk tier; False when it has no valid
        copy (then compute the page)."""
        rows = self.disk.read(page_hash, prev_hash, token_ids) if self.disk is not None else None
        if rows is None:
            return False
        for layer, (k, v) in enumerate(zip(self.k, self.v)):
            index = self._index(layer, page_id, slot)
            if index is not None:
                k[index].copy_(rows[2 * layer])
                v[index].copy_(rows[2 * layer + 1])
        return True

    @property
    def num_bytes(self) -> int:
        """Every byte of the pages, quantized blocks' scales included, and of the recurrent-state slots."""
        pages = sum(t.numel() * t.element_size() for t in self.k + self.v)
        return pages + (self.state.num_bytes if self.state is not None else 0)

    @property
    def bytes_per_token(self) -> int:
        """Bytes of the pages per token (the recurrent state does not grow with tokens)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v) // self.max_seq_len


def window_pool_tokens(window: int, page_size: int, max_seq_len: int, sliding_tokens: int | None = None) -> int:
    """Tokens the sliding-window layers of a cache of `max_seq_len` tokens keep: `sliding_tokens` (None: WINDOW_JOBS
    jobs' windows and prompt chunks) in whole pages, and never more than `max_seq_len` (then they keep every page)."""
    if sliding_tokens is None:
        sliding_tokens = WINDOW_JOBS * (window + WINDOW_CHUNK + 2 * page_size)
    return min(max_seq_len, -(-sliding_tokens // page_size) * page_size)


def layer_windows(model, num_layers: int) -> list[int | None]:
    """Each layer's sliding window (None: it sees every position), read from its attention module."""
    windows: list[int | None] = [None] * num_layers
    for module in model.modules():
        index, window = getattr(module, "layer_idx", None), getattr(module, "sliding_window", None)
        if isinstance(index, int) and 0 <= index < num_layers and window:
            windows[index] = int(window)
    return windows
