"""Sliding-window layers' memory: slots that hold a page's rows for those layers only while a window sees it.
Ids and counts only, no tensors.

Layers that attend to the last `window` positions only (Gemma 3's local layers, Mistral's) keep their keys and
values apart from the other layers', in `num_slots` slots of one page each. A sequence's page takes a slot just
before the sequence writes into it and gives it back once no later query of the sequence can see it:

    positions     0 ........................................ start ...... end
    pages         [p0][p1][p2][p3][p4][p5][p6][p7][p8][p9][p10]
    slots held                     <--- window + margin ---><-- this step -->
                  released: the other layers keep these pages, the windowed layers' rows are gone or cached

A released slot keeps its rows and its link to the page, in LRU order, until another page needs it: a later
prompt that shares the prefix resumes there when every page its window reads still has its slot (lookup cuts
the hit back to such a point, down to a cold start). `margin` tokens behind the window stay held so a short
rewind (a banned string's) finds its rows; a longer one resumes where the rows are still held or cached.

Admission reserves a quota per sequence (`quota`): the most slots it can hold at once, from its window, its
largest step and the margin. The quotas of admitted sequences never add up past `num_slots`, so a running
sequence always finds a slot. After its prompt a sequence's quota shrinks to a decode step's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

from engine.cache.page_table import Page


class WindowedSeq(Protocol):
    """What the window reads and writes of a scheduler's sequence."""

    tokens: list[int]
    pages: list[Page]
    num_computed: int
    max_step: int  # the most tokens one of its prefill steps feeds (chunk, widened to keep an image whole)
    slots_held: set[int]  # indices into `pages` whose slot this sequence holds
    window_quota: int  # slots reserved for it at admission (0 before)


class WindowSlots:
    """The slot pool of the windowed layers and each sequence's share of it."""

    def __init__(self, num_slots: int, window: int, page_size: int, decode_tokens: int = 1, margin: int | None = None):
        if num_slots <= 0 or window <= 0:
            raise ValueError(f"num_slots ({num_slots}) and window ({window}) must be positive")
        self.num_slots = num_slots
        self.window = window
        self.page_size = page_size
        self.decode_tokens = decode_tokens  # a decode step's fed tokens: the new one and its drafts
        self.margin = page_size if margin is None else margin
        self.holder: list[Page | None] = [None] * num_slots  # the page whose rows a slot holds
        self.refs = [0] * num_slots
        self._free: OrderedDict[int, None] = OrderedDict((s, None) for s in range(num_slots))
        self.reserved = 0  # the quotas of admitted sequences

    # --- geometry ------------------------------------------------------------------------------------------

    def first_page(self, start: int, margin: int = 0) -> int:
        """The first page a query at position `start` (or `margin` tokens before it) can see."""
        return max(0, start - self.window + 1 - margin) // self.page_size

    def reads(self, start: int) -> range:
        """Indices of the pages a sequence resuming at `start` reads before computing anything."""
        return range(self.first_page(start), (start + self.page_size - 1) // self.page_size)

    def quota(self, seq: WindowedSeq, start: int, num_pages: int) -> int:
        """The most slots `seq` (of `num_pages` pages) can hold from `start` on: its window, margin and largest
        step's pages (a step of s tokens from `start` holds pages first_page(start, margin) ..
        (start + s - 1) // page_size: at most slots_for(s)), and never more than the pool: room() then cuts its
        prompt chunks to fit."""
        step = max(min(seq.max_step, len(seq.tokens) - start), self.decode_tokens)
        return min(num_pages, self.num_slots, self.slots_for(step))

    def slots_for(self, step: int) -> int:
        """Slots a sequence holds at most while its steps feed up to `step` tokens."""
        return (step + self.window - 2 + self.margin) // self.page_size + 2

    def room(self, seq: WindowedSeq) -> int | None:
        """The most tokens the sequence's next step may feed within its quota (None: its every page fits)."""
        if seq.window_quota >= len(seq.pages):
            return None
        return max(1, (seq.window_quota - 1) * self.page_size - self.window + 1 - self.margin)

    # --- slots ---------------------------------------------------------------------------------------------

    def has_rows(self, page: Page) -> bool:
        """Whether a slot still holds this page's rows (held, or released and not reused yet)."""
        return page.slot is not None and self.holder[page.slot] is page

    def can_reserve(self, quotas: Iterable[int]) -> bool:
        return self.reserved + sum(quotas) <= self.num_slots

    def hold(self, seq: WindowedSeq, idx: int) -> None:
        """Hold page `idx` of `seq` in a slot: its own if it still has one, else a fresh one (then it must have
        no rows the windowed layers will read: they are written after this)."""
        if idx in seq.slots_held:
            return
        page = seq.pages[idx]
        if self.has_rows(page):
            if self.refs[page.slot] == 0:
                del self._free[page.slot]
        else:
            if not self._free:
                raise RuntimeError("no free window slot; admission should have reserved one")
            slot, _ = self._free.popitem(last=False)
            old = self.holder[slot]
            if old is not None and old.slot == slot:
                old.slot = None
            self.holder[slot], page.slot = page, slot
        self.refs[page.slot] += 1
        seq.slots_held.add(idx)

    def release(self, seq: WindowedSeq, idx: int) -> None:
        """Give back page `idx`'s slot; its rows stay cached (LRU) while no other page needs the slot."""
        seq.slots_held.discard(idx)
        slot = seq.pages[idx].slot
        self.refs[slot] -= 1
        if self.refs[slot] == 0:
            self._free[slot] = None

    def release_all(self, seq: WindowedSeq) -> None:
        for idx in list(seq.slots_held):
            self.release(seq, idx)
        self.reserved -= seq.window_quota
        seq.window_quota = 0

    def forget(self, page: Page) -> None:
        """The page is reused for other tokens: its slot's rows no longer belong to it (reuse the slot first)."""
        if page.slot is not None and self.holder[page.slot] is page:
            self.holder[page.slot] = None
            if self.refs[page.slot] == 0:
                self._free.move_to_end(page.slot, last=False)
        page.slot = None

    # --- a sequence's window -------------------------------------------------------------------------------

    def admit(self, seq: WindowedSeq, quota: int) -> None:
        """Reserve `quota` slots for `seq` (can_reserve said yes) and hold the pages its first step reads."""
        seq.window_quota = quota
        self.reserved += quota
        for idx in self.reads(seq.num_computed):
            self.hold(seq, idx)

    def step(self, seq: WindowedSeq, start: int, end: int) -> None:
        """Before a forward that writes positions [start, end): release the pages no query from `start` on can
        see (the margin aside), and hold every page the step reads or writes."""
        keep = self.first_page(start, self.margin)
        for idx in [i for i in seq.slots_held if i < keep]:
            self.release(seq, idx)
        for idx in range(self.first_page(start), (end - 1) // self.page_size + 1):
            self.hold(seq, idx)
        over = len(seq.slots_held) - seq.window_quota
        if over > 0:  # a step past room() (an image kept whole): grow the quota while the pool allows
            if self.reserved + over > self.num_slots:
                raise RuntimeError(
                    f"a step of {end - start} tokens needs {len(seq.slots_held)} window slots, over its quota of "
                    f"{seq.window_quota}, and the pool has no slot to spare; make the cache's sliding_tokens larger"
                )
            self.reserved += over
            seq.window_quota += over
        # Once the prompt is in, later steps are decode steps: give back what only prompt chunks needed.
        shrunk = max(len(seq.slots_held), self.quota(seq, end, len(seq.pages)))
        if shrunk < seq.window_quota:
            self.reserved -= seq.window_quota - shrunk
            seq.window_quota = shrunk

    def rewound(self, seq: WindowedSeq, num_tokens: int) -> int:
        """After a rewind to `num_tokens`: release the pages past it and hold the window before it again.
        Returns where the sequence resumes: `num_tokens`, or 0 when a page of that window lost its rows."""
        ps = self.page_size
        for idx in [i for i in seq.slots_held if i * ps >= num_tokens]:
            self.release(seq, idx)
        needed = self.reads(num_tokens)
        if all(i in seq.slots_held or self.has_rows(seq.pages[i]) for i in needed):
            for idx in needed:
                self.hold(seq, idx)
            return num_tokens
        for idx in list(seq.slots_held):
            self.release(seq, idx)
        return 0
