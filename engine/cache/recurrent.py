"""Recurrent-state slots: the memory of linear-attention layers (Gated DeltaNet), and the snapshots that let a
prefix or a rewind resume without recomputing from the first token.

A linear-attention layer keeps no keys and values per token; each sequence carries a fixed-size state instead
(kernels/torch_ref/delta_rule.py): a conv window and the delta rule's matrix per layer. The cache keeps them in a
pool of slots, each holding every linear layer's state at one point of one token chain:

    RecurrentState (tensors, in the Cache)      StateSlots (ids, in the cache manager)
    conv[layer]   [num_slots, conv_dim, width]  a running sequence's live slot (and its spare), or a snapshot:
    delta[layer]  [num_slots, H, Dk, Dv] fp32   the state after a full page, or after a finished sequence's
                                                rows, keyed by the chain hash of those tokens

A slot holds the state after one token only, so a page's K/V rows are worth resuming from only where the state
after them was copied aside. The manager (engine/cache/manager.py) keeps such snapshots, least recently used first
out, at page boundaries and at a finished sequence's end (the next chat turn resumes there), and restores them:
into a new sequence's live slot when its prompt shares the prefix, into a running one's when it rewinds. Which
copies to make is decided with ids (StateCopy); the generator runs them (RecurrentState.copy_slot) before the next
forward, in the order they were asked for, so a slot always holds what the last copy or forward wrote into it.

    `state_bytes` (Cache) sizes the live slots: that many sequences run at once; `snapshot_bytes` adds slots
    for snapshots. A sequence takes a free slot first, then a snapshot's (least recently used), never another
    sequence's; a snapshot takes a free slot or the least recently used snapshot's, so snapshots use whatever
    running sequences leave.

A sequence that may rewind also holds a spare slot. With speculative decoding it keeps the state before the
drafts of a verify step. With banned strings (such a sequence does not draft) it keeps the state before the page
that holds the last prompt token, or later in that page: no rewind goes further back, and the pages from there on
are the sequence's own, so recomputing their rows disturbs no other sequence.

A layer starting a sequence at position 0 zeroes its slot first, so a slot needs no clearing between owners, and
position 0 is a restore point that needs no copy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class StateShape:
    """One linear-attention layer's state per sequence."""

    conv_dim: int  # channels of the causal conv (q, k and v together)
    conv_width: int  # inputs the conv window keeps: kernel size - 1
    num_heads: int  # value heads; each has its own key_dim x value_dim matrix
    key_dim: int
    value_dim: int

    def num_bytes(self, conv_dtype: torch.dtype) -> int:
        itemsize = torch.empty(0, dtype=conv_dtype).element_size()
        return state_bytes(self.conv_dim * self.conv_width, self.num_heads * self.key_dim * self.value_dim, itemsize)


def state_bytes(conv_elements: int, delta_elements: int, conv_itemsize: int) -> int:
    """Bytes of one layer's state: the conv window in the cache's dtype (`conv_itemsize` bytes an element), the
    delta state in float32."""
    return conv_elements * conv_itemsize + delta_elements * 4


def state_shapes(model, num_layers: int) -> dict[int, StateShape]:
    """The layers that keep a recurrent state instead of KV pages: modules with a `layer_idx` and a `state_shape`."""
    shapes: dict[int, StateShape] = {}
    for module in model.modules():
        index, shape = getattr(module, "layer_idx", None), getattr(module, "state_shape", None)
        if isinstance(index, int) and 0 <= index < num_layers and isinstance(shape, StateShape):
            shapes[index] = shape
    return shapes


class RecurrentState:
    """The slot pool's tensors, per linear-attention layer: conv windows in the cache's dtype, delta states in
    float32 (they accumulate over the whole sequence, so they are not rounded to bfloat16 between tokens).
    `num_live` of the `num_slots` slots are for running sequences, the rest for snapshots."""

    def __init__(
        self,
        shapes: dict[int, StateShape],
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device,
        num_live: int | None = None,
    ):
        if num_slots < 1:
            raise ValueError(f"a recurrent-state pool needs at least one slot, got {num_slots}")
        self.shapes = dict(shapes)
        self.num_slots = num_slots
        self.num_live = num_slots if num_live is None else num_live
        self.bytes_per_slot = sum(s.num_bytes(dtype) for s in shapes.values())
        self.conv = {
            i: torch.zeros((num_slots, s.conv_dim, s.conv_width), dtype=dtype, device=device) for i, s in shapes.items()
        }
        self.delta = {
            i: torch.zeros((num_slots, s.num_heads, s.key_dim, s.value_dim), dtype=torch.float32, device=device)
            for i, s in shapes.items()
        }

    @classmethod
    def for_budget(
        cls,
        shapes: dict[int, StateShape],
        num_bytes: int,
        dtype: torch.dtype,
        device: torch.device,
        snapshot_bytes: int = 0,
    ) -> RecurrentState:
        """As many live slots as `num_bytes` holds, and as many snapshot slots as `snapshot_bytes` holds; a clear
        error when `num_bytes` holds no sequence's state."""
        per_slot = sum(s.num_bytes(dtype) for s in shapes.values())
        if num_bytes < per_slot:
            raise ValueError(
                f"state_bytes={num_bytes:,} holds no sequence's recurrent state: one sequence needs {per_slot:,} "
                f"bytes ({len(shapes)} linear-attention layers); make the cache with state_bytes >= {per_slot:,}"
            )
        if snapshot_bytes < 0:
            raise ValueError(f"snapshot_bytes must be 0 or more, got {snapshot_bytes}")
        live = num_bytes // per_slot
        return cls(shapes, live + snapshot_bytes // per_slot, dtype, device, num_live=live)

    def copy_slot(self, src: int, dst: int) -> None:
        """Every layer's state of slot `src` into slot `dst` (a snapshot taken or restored)."""
        if src == dst:
            return
        for tensors in (self.conv, self.delta):
            for t in tensors.values():
                t[dst].copy_(t[src])

    @property
    def num_bytes(self) -> int:
        return self.bytes_per_slot * self.num_slots


@dataclass(frozen=True)
class StateCopy:
    """Copy every linear layer's state of slot `src` into slot `dst` before the next forward (after the copies
    asked for before it)."""

    src: int
    dst: int


class StatefulSeq(Protocol):
    """What the slot bookkeeping reads and writes of a scheduler's sequence."""

    state_slot: int  # its live slot, -1 when none
    spare_slot: int  # its spare slot, -1 when none
    state_at: int  # tokens the live slot's state has taken in
    spare_at: int  # tokens the spare's state has taken in; -1 when it holds none


class StateSlots:
    """Which slot holds what: running sequences' live and spare slots, and snapshots by chain hash in LRU order.
    Ids only, no tensors (the manager's part). Snapshot slots are found with `snapshot`, kept with `keep`."""

    def __init__(self, num_slots: int, num_live: int | None = None, bytes_per_slot: int = 0):
        if num_slots < 1:
            raise ValueError(f"num_slots must be at least 1, got {num_slots}")
        self.num_slots = num_slots
        self.num_live = num_slots if num_live is None else min(num_live, num_slots)
        self.bytes_per_slot = bytes_per_slot  # for error messages that say how large to make the pool
        self._free = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._snapshots: OrderedDict[int, int] = OrderedDict()  # chain hash -> slot, least recently used first
        self._pinned: set[int] = set()  # hashes no take may evict right now (a prefix hit being admitted)
        self.num_running = 0  # sequences holding a live slot

    # --- counts --------------------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Slots no sequence holds (free, or holding a snapshot)."""
        return len(self._free) + len(self._snapshots)

    @property
    def num_snapshots(self) -> int:
        return len(self._snapshots)

    def can_take(self, num_seqs: int, num_spares: int = 0, keep: Iterable[int] = ()) -> bool:
        """Whether `num_seqs` more sequences may run, holding `num_spares` spare slots between them, while the
        snapshots `keep` (chain hashes) stay."""
        kept = sum(1 for h in set(keep) if h in self._snapshots)
        room = len(self._free) + len(self._snapshots) - kept
        return self.num_running + num_seqs <= self.num_live and num_seqs + num_spares <= room

    # --- sequences -----------------------------------------------------------------------------------------

    def take(self, seq: StatefulSeq, spare: bool = False) -> int:
        """Give `seq` a live slot (and a spare one); can_take said there is room. Its state is at token 0."""
        if seq.state_slot >= 0:
            raise RuntimeError(f"the sequence already holds recurrent-state slot {seq.state_slot}")
        if self.num_running >= self.num_live:
            raise RuntimeError("every live recurrent-state slot is taken; admission should have checked can_take()")
        seq.state_slot = self._slot(for_sequence=True)
        seq.state_at, seq.spare_at = 0, -1
        self.num_running += 1
        if spare:
            seq.spare_slot = self._slot(for_sequence=True)
        return seq.state_slot

    def release(self, seq: StatefulSeq) -> None:
        """Take back the sequence's slots, if it holds any."""
        if seq.state_slot >= 0:
            self.num_running -= 1
        for slot in (seq.state_slot, seq.spare_slot):
            if slot >= 0:
                self._free.append(slot)
        seq.state_slot = seq.spare_slot = -1
        seq.spare_at = -1

    # --- snapshots -----------------------------------------------------------------------------------------

    def has(self, chain_hash: int) -> bool:
        return chain_hash in self._snapshots

    def snapshot(self, chain_hash: int) -> int | None:
        """The slot of the snapshot after the page named `chain_hash` (now the most recently used), or None."""
        slot = self._snapshots.get(chain_hash)
        if slot is not None:
            self._snapshots.move_to_end(chain_hash)
        return slot

    def keep(self, chain_hash: int) -> int | None:
        """A slot for a new snapshot named `chain_hash`, to copy into; None when one is kept already (it is now the
        most recently used) or no slot can be had without taking a running sequence's."""
        if self.snapshot(chain_hash) is not None:
            return None
        slot = self._slot(for_sequence=False)
        if slot is not None:
            self._snapshots[chain_hash] = slot
        return slot

    def pin(self, hashes: Iterable[int]) -> None:
        """Keep these snapshots from eviction until unpin() (while their restores are planned)."""
        self._pinned = set(hashes)

    def unpin(self) -> None:
        self._pinned = set()

    def _slot(self, for_sequence: bool) -> int | None:
        """A free slot, else the least recently used snapshot's that is not pinned (None when there is none)."""
        if self._free:
            return self._free.pop()
        for h in self._snapshots:
            if h not in self._pinned:
                return self._snapshots.pop(h)
        if for_sequence:
            raise RuntimeError("no recurrent-state slot left; admission should have checked can_take()")
        return None
