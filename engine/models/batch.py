"""What one forward call needs to know about its ragged batch, as tensors the model can use directly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Batch:
    """A ragged batch: several sequences, each adding `query_lens[i]` tokens after `past_lens[i]` cached ones.

    Tokens of all sequences are concatenated on one axis (num_tokens = sum(query_lens)). The host-side tuples
    let ops plan work without reading tensors back from the device.
    """

    cache: object  # engine.cache.Cache: per-layer k/v page tensors
    block_tables: torch.Tensor  # [num_seqs, max_pages] int64 page ids
    seq_lens: torch.Tensor  # [num_seqs] int64: cached tokens after this step
    slot_mapping: torch.Tensor  # [num_tokens] int64: page_id * page_size + offset for each new token
    logits_indices: torch.Tensor | None  # rows of the token axis that need logits; None = all
    query_lens: tuple[int, ...]
    past_lens: tuple[int, ...]
    # [num_tokens] int64 ids of the new tokens, image ids included, when the caller has them (the generator
    # does). Models that treat image tokens specially read it (Gemma 3's image rows attend to each other).
    token_ids: torch.Tensor | None = None
    # Per sequence, the first page id when the pages it reads this step are consecutive ids, else -1.
    page_runs: tuple[int, ...] = ()
    # The sliding-window layers' tables and slots when the cache keeps them in window slots of their own
    # (engine/cache/window.py): the same shapes as block_tables and slot_mapping, in slot ids.
    window_tables: torch.Tensor | None = None
    window_slots: torch.Tensor | None = None
    # Per sequence, its recurrent-state slot, when the cache keeps linear-attention state (engine/cache/recurrent.py).
    state_slots: tuple[int, ...] = ()

    def pages_of(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
        """(block tables, slot mapping, page runs) of layer `layer_idx`: its window slots' or the pages'."""
        if self.window_tables is not None and layer_idx in self.cache.window_layers:
            return self.window_tables, self.window_slots, ()
        return self.block_tables, self.slot_mapping, self.page_runs

    def state_of(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv windows [num_slots, conv_dim, width], delta states [num_slots, heads, key_dim, value_dim]) of
        linear-attention layer `layer_idx`: the whole pool; `state_slots` says which slot is each sequence's."""
        state = self.cache.state
        return state.conv[layer_idx], state.delta[layer_idx]

    @property
    def seq_lens_host(self) -> tuple[int, ...]:
        return tuple(p + q for p, q in zip(self.past_lens, self.query_lens))

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @classmethod
    def build(
        cls,
        cache,
        block_tables: Sequence[Sequence[int]],
        past_lens: Sequence[int],
        query_lens: Sequence[int],
        logits: str | Sequence[Sequence[int]] = "last",
        window_tables: Sequence[Sequence[int]] | None = None,
        state_slots: Sequence[int] | None = None,
    ) -> Batch:
        """Make a batch from host-side page lists.

        `logits` is "last" (last new token of each sequence), "all", or per sequence the offsets within its
        new tokens that need logits. `window_tables`: per sequence, the window slot of each page, for a cache
        whose sliding-window layers live in slots (the cache manager's window_table()). `state_slots`: per
        sequence, its recurrent-state slot (the generator's from the cache manager); None gives sequence i slot i.
        """
        device = cache.device
        page_size = cache.page_size
        max_pages = max(len(t) for t in block_tables)
        tables = torch.zeros((len(block_tables), max(max_pages, 1)), dtype=torch.int64)
        slots: list[int] = []
        rows: list[int] = []
        start = 0
        for i, (table, past, n) in enumerate(zip(block_tables, past_lens, query_lens)):
            if past + n > len(table) * page_size:
                raise ValueError(f"sequence {i} needs {past + n} slots but has {len(table)} pages of {page_size}")
            tables[i, : len(table)] = torch.tensor(table, dtype=torch.int64)
            slots.extend(table[p // page_size] * page_size + p % page_size for p in range(past, past + n))
            if logits == "last":
                rows.append(start + n - 1)
            elif logits != "all":
                rows.extend(start + j for j in logits[i])
            start += n
        windows = {}
        if window_tables is not None:
            windows = dict(
                window_tables=_table_tensor(window_tables, tables.shape[1]).to(device),
                window_slots=torch.tensor(
                    [
                        t[p // page_size] * page_size + p % page_size
                        for t, past, n in zip(window_tables, past_lens, query_lens)
                        for p in range(past, past + n)
                    ],
                    dtype=torch.int64,
                    device=device,
                ),  # fmt: skip
            )
        state = getattr(cache, "state", None)
        if state is not None and state_slots is None:
            if len(block_tables) > state.num_slots:
                raise ValueError(f"{len(block_tables)} sequences but the cache has {state.num_slots} state slots")
            state_slots = range(len(block_tables))
        return cls(
            cache=cache,
            block_tables=tables.to(device),
            seq_lens=torch.tensor([p + n for p, n in zip(past_lens, query_lens)], dtype=torch.int64, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            logits_indices=None if logits == "all" else torch.tensor(rows, dtype=torch.int64, device=device),
            query_lens=tuple(int(n) for n in query_lens),
            past_lens=tuple(int(p) for p in past_lens),
            page_runs=tuple(
                _run_start(table, (past + n + page_size - 1) // page_size)
                for table, past, n in zip(block_tables, past_lens, query_lens)
            ),
            **windows,
            state_slots=() if state is None else tuple(int(s) for s in state_slots),
        )

    def positions(self) -> torch.Tensor:
        """Standard 1-D positions: each sequence continues from its cached length. [num_tokens] int64."""
        pos = [torch.arange(p, p + n) for p, n in zip(self.past_lens, self.query_lens)]
        return torch.cat(pos).to(self.slot_mapping.device)


def _run_start(table: Sequence[int], num_pages: int) -> int:
    """table[0] when table[:num_pages] are consecutive page ids, else -1."""
    first = int(table[0]) if num_pages else -1
    return first if all(int(table[j]) == first + j for j in range(num_pages)) else -1


def _table_tensor(tables: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    out = torch.zeros((len(tables), width), dtype=torch.int64)
    for i, table in enumerate(tables):
        out[i, : len(table)] = torch.tensor(table, dtype=torch.int64)
    return out
