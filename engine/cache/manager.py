"""The cache's manager: the one object the scheduler asks for cache memory. Ids and counts only, no tensors.

    scheduler asks                    the manager does (PageTable underneath)
    lookup(prompt_ids)          ->    cached full pages of the prompt, and whether its next one is being computed
    allocate(seqs, n, hits)     ->    hold the hits, plan a copy of a partly matching page, fresh pages for the
                                      rest: all the sequences or none
    commit(seq, num_tokens)     ->    record the rows the forward wrote; name pages that became full
    rewind(seq, num_tokens)     ->    drop rows past num_tokens (they are recomputed)
    free(seq)                   ->    name late pages, release every page (their KV stays cached)

With a disk tier (a PageStore), lookup() also finds the prompt's next full pages on disk; allocate() gives them
fresh pages and plans their loads (take_loads, then loads_done: a page that fails to load is computed instead),
and pages named from then on wait in take_named() for the caller to write.

A sequence's memory is one page list for its attention layers. Sliding-window layers, when the cache keeps
them apart (a WindowSlots, window.py), hold slots only for the pages their window sees: allocate() reserves a
sequence's quota, step(seq, start, end) moves its window before each forward, and lookup() cuts a prefix hit back
to a point whose window still has its rows. Other kinds of layer memory (recurrent-state slots) belong behind
these same calls, so the scheduler keeps seeing sequences and token counts only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.cache.page_table import ROOT_HASH, Page, PageTable, chain_hash
from engine.cache.window import WindowSlots


class PageStore(Protocol):
    """The manager's view of a disk tier: which chain hashes it holds (reading and writing tensors is not its job)."""

    def contains(self, page_hash: int) -> bool: ...


class ManagedSeq(Protocol):
    """What the manager reads of a scheduler's sequence (ids, lengths) and writes (pages, num_computed)."""

    serial: int  # owner of the pages it computes; a CFG pair's two sequences share one
    tokens: list[int]  # prompt + generated
    prompt_len: int
    may_rewind: bool  # generated rows may be undone (banned strings): name their pages only at free()
    pages: list[Page]
    num_computed: int  # tokens whose K/V rows are valid in the cache
    max_step: int  # the most tokens one prefill step feeds (sizes its window quota)
    slots_held: set[int]  # indices into `pages` whose window slot it holds (window.py)
    window_quota: int


@dataclass(frozen=True)
class PrefixHit:
    """What the cache holds of a prompt: full pages covering its start (the last token is never among them)."""

    pages: tuple[Page, ...]
    prev_hash: int  # chain hash after those pages (and the disk pages)
    num_tokens: int
    pending: bool  # another sequence is computing the prompt's next full page right now
    disk_hashes: tuple[int, ...] = ()  # full pages after `pages` that the disk tier holds (counted in num_tokens)


@dataclass(frozen=True)
class DiskPage:
    """A full page that moves between memory and the disk tier: its id, chain hash and tokens."""

    page_id: int
    hash: int
    prev_hash: int
    token_ids: tuple[int, ...]
    slot: int | None = None  # the window slot of its sliding-window layers' rows (None: not kept there)


@dataclass(frozen=True)
class PageCopy:
    """Copy the first `num_tokens` K/V rows of page `src` into page `dst` before the next forward (and of window
    slot `src_slot` into `dst_slot` for the sliding-window layers, when the cache keeps them apart)."""

    src: int
    dst: int
    num_tokens: int
    src_slot: int | None = None
    dst_slot: int | None = None


class CacheManager:
    """Owns the page table: prefix lookup, allocation, committed rows, rewinds and release of sequences' pages."""

    def __init__(
        self, num_pages: int, page_size: int, disk: PageStore | None = None, window: WindowSlots | None = None
    ):
        self.window = window
        self.table = PageTable(num_pages, page_size, on_forget=window.forget if window is not None else None)
        self.page_size = page_size
        self.disk = disk
        self._planned: dict[int, int] = {}  # chain hash of a prompt page being prefilled -> serial
        self._copy_sources: list[Page] = []
        self._loads: list[tuple[ManagedSeq, int, DiskPage]] = []  # (sequence, page index, page) to fill from disk
        self._named: list[DiskPage] = []  # pages named since take_named(), for the disk tier

    # --- counts ------------------------------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        return self.table.num_pages

    @property
    def num_free(self) -> int:
        """Pages no sequence references (they may still hold a cached prefix)."""
        return self.table.num_free

    def pages_for(self, num_tokens: int) -> int:
        return self.table.pages_for(num_tokens)

    # --- admission ---------------------------------------------------------------------------------------

    def lookup(self, prompt_ids: Sequence[int]) -> PrefixHit:
        """The cached full pages a prompt can start from; takes no reference, so allocate() must follow at once."""
        ps = self.page_size
        # The last prompt token is always recomputed: it produces the first logits.
        reusable = len(prompt_ids) - 1
        matched = self.table.match_full_pages(prompt_ids, reusable)
        prev = matched[-1].hash if matched else ROOT_HASH
        done = len(matched) * ps
        on_disk: list[int] = []
        while self.disk is not None and done + ps <= reusable:
            h = chain_hash(prev, prompt_ids[done : done + ps])
            if h in self._planned or not self.disk.contains(h):
                break
            on_disk.append(h)
            prev, done = h, done + ps
        while self.window is not None and not self._window_ready(matched, done):
            # the sliding-window layers lost a page this point reads: resume a page earlier
            if on_disk:
                on_disk.pop()
            else:
                matched.pop()
            done -= ps
            prev = on_disk[-1] if on_disk else matched[-1].hash if matched else ROOT_HASH
        pending = done + ps <= reusable and chain_hash(prev, prompt_ids[done : done + ps]) in self._planned
        return PrefixHit(tuple(matched), prev, done, pending, tuple(on_disk))

    def _window_ready(self, matched: list[Page], done: int) -> bool:
        # pages from disk bring every layer's rows; pages in memory need their window slot's
        return all(i >= len(matched) or self.window.has_rows(matched[i]) for i in self.window.reads(done))

    def allocate(
        self, seqs: Sequence[ManagedSeq], num_tokens: Sequence[int], hits: Sequence[PrefixHit]
    ) -> list[PageCopy] | None:
        """Pages for `num_tokens[i]` tokens of each waiting sequence, starting from `hits[i]` (its lookup()).

        All the sequences get their pages or none does (None: they do not fit now, and nothing changed). Sets each
        sequence's `pages` and `num_computed`; the returned copies must run before the next forward, and
        copies_done() be called after them.
        """
        needed = [self.pages_for(n) - len(hit.pages) for n, hit in zip(num_tokens, hits)]
        held = {p.page_id: p for hit in hits for p in hit.pages}
        if sum(needed) > self.num_free - sum(1 for p in held.values() if p.ref_count == 0):
            return None
        if self.window is not None and not self.window.can_reserve(
            self._quota(seq, n, hit) for seq, n, hit in zip(seqs, num_tokens, hits)
        ):
            return None
        # Hold every hit while allocating, so one sequence's fresh pages cannot evict another's prefix.
        for page in held.values():
            self.table.acquire(page)
        copies: list[PageCopy] = []
        for i, (seq, hit) in enumerate(zip(seqs, hits)):
            copies += self._allocate_one(seq, hit, needed[i], reserve=sum(needed[i + 1 :]))
        for page in held.values():
            self.table.release(page)
        return copies

    def _allocate_one(self, seq: ManagedSeq, hit: PrefixHit, num_new: int, reserve: int) -> list[PageCopy]:
        """Take the hit's pages, a partial-page copy when one is worth it, and `num_new` fresh pages."""
        ps = self.page_size
        reusable = seq.prompt_len - 1
        done, prev = hit.num_tokens, hit.prev_hash
        for page in hit.pages:
            self.table.acquire(page)
        source, num_copy = self.table.best_partial(prev, seq.tokens[done:], min(ps, reusable - done))
        if source is not None and self.window is not None and not self.window.has_rows(source):
            source, num_copy = None, 0  # its sliding-window layers' rows are gone
        if source is not None and num_copy > 0:
            if source.ref_count == 0 and self.num_free - 1 < num_new + reserve:
                source, num_copy = None, 0  # holding the source would starve the allocation
            else:
                self.table.acquire(source)  # keep it from being reused before the copy happens
                self._copy_sources.append(source)
        # Pages loaded from disk come first; each follows the one before, so its prev_hash is known now.
        num_disk = len(hit.disk_hashes)
        chain = [hit.pages[-1].hash if hit.pages else ROOT_HASH, *hit.disk_hashes]
        new_pages: list[Page] = []
        for i in range(num_new):
            before = new_pages[-1] if new_pages else (hit.pages[-1] if hit.pages else None)
            after = before.page_id if before is not None else None
            follows = chain[i] if i <= num_disk else ROOT_HASH
            new_pages.append(self.table.allocate(follows, seq.serial, after=after))
        seq.pages = list(hit.pages) + new_pages
        seq.num_computed = done + num_copy
        if self.window is not None:
            self.window.admit(seq, self.window.quota(seq, hit.num_tokens, len(seq.pages)))
        for i, h in enumerate(hit.disk_hashes):
            idx = len(hit.pages) + i
            page = new_pages[i]
            page.token_ids = list(seq.tokens[idx * ps : (idx + 1) * ps])
            slot = page.slot if idx in seq.slots_held else None
            self._loads.append((seq, idx, DiskPage(page.page_id, h, chain[i], tuple(page.token_ids), slot)))
        copies = []
        if num_copy > 0:
            dst = new_pages[num_disk]
            dst.token_ids = list(seq.tokens[done : done + num_copy])
            slots = (source.slot, dst.slot) if self.window is not None else (None, None)
            copies.append(PageCopy(source.page_id, dst.page_id, num_copy, *slots))
        # Announce the prompt pages this sequence will compute, so a twin prompt waits instead of duplicating.
        h = prev
        for start in range(done, reusable - ps + 1, ps):
            h = chain_hash(h, seq.tokens[start : start + ps])
            self._planned.setdefault(h, seq.serial)
        return copies

    def _quota(self, seq: ManagedSeq, num_tokens: int, hit: PrefixHit) -> int:
        """The window slots `seq` reserves when admitted from `hit` (0 without a window)."""
        if self.window is None:
            return 0
        return self.window.quota(seq, hit.num_tokens, self.pages_for(num_tokens))

    def copies_done(self) -> None:
        """The page copies returned by allocate() ran: drop the sources' temporary holds."""
        for page in self._copy_sources:
            self.table.release(page)
        self._copy_sources.clear()

    def take_loads(self) -> list[DiskPage]:
        """Pages allocate() planned to fill from the disk tier; run them before the next forward, then loads_done()."""
        return [load for _, _, load in self._loads]

    def loads_done(self, failed: set[int]) -> list[ManagedSeq]:
        """The loads ran; `failed`: ids of pages that got no valid copy. Loaded pages are named (shared from now
        on); a sequence with a failed page keeps only the pages before it and computes the rest. Returns those
        sequences."""
        ps = self.page_size
        first_failed: dict[int, tuple[ManagedSeq, int]] = {}
        for seq, idx, load in self._loads:
            if load.page_id in failed and id(seq) not in first_failed:
                first_failed[id(seq)] = (seq, idx)
        for seq, idx, _ in self._loads:
            cut = first_failed.get(id(seq))
            if cut is None or idx < cut[1]:
                self.table.register_full(seq.pages[idx])
        self._loads.clear()
        for seq, idx in first_failed.values():
            self.rewind(seq, idx * ps)
        return [seq for seq, _ in first_failed.values()]

    def take_named(self) -> list[DiskPage]:
        """Pages named since the last call that still hold those rows: the disk tier's to write."""
        named = [d for d in self._named if self.table.pages[d.page_id].hash == d.hash]
        self._named.clear()
        if self.window is not None:  # a page saved whole needs its sliding-window rows too
            named = [
                d for d in named if d.slot is not None and self.window.holder[d.slot] is self.table.pages[d.page_id]
            ]
        return named

    def step(self, seq: ManagedSeq, start: int, end: int) -> None:
        """Before a forward writing positions [start, end) of `seq`: move its window (see window.py)."""
        if self.window is not None:
            self.window.step(seq, start, end)

    def step_room(self, seq: ManagedSeq) -> int | None:
        """The most tokens the next step of `seq` may feed within its window quota (None: no such bound)."""
        return None if self.window is None else self.window.room(seq)

    def window_table(self, seq: ManagedSeq) -> list[int]:
        """The window slot of each of the sequence's pages (0 for pages its window no longer reads)."""
        return [p.slot if p.slot is not None else 0 for p in seq.pages]

    # --- running -----------------------------------------------------------------------------------------

    def commit(self, seq: ManagedSeq, num_tokens: int) -> None:
        """The forward wrote K/V rows up to token `num_tokens` (from `seq.num_computed`): record them and name
        pages that became full, so later prompts can share them."""
        ps = self.page_size
        for pos in range(seq.num_computed, num_tokens):
            page = seq.pages[pos // ps]
            page.token_ids.append(seq.tokens[pos])
            if len(page.token_ids) == ps and self._may_name(seq, pos):
                self._name_page(seq, pos // ps)
        seq.num_computed = num_tokens

    def rewind(self, seq: ManagedSeq, num_tokens: int) -> None:
        """Keep only the K/V rows of the first `num_tokens` tokens; the rest are computed again."""
        ps = self.page_size
        if self.window is not None and seq.window_quota:
            num_tokens = self.window.rewound(seq, min(num_tokens, seq.num_computed))
        for idx in range(num_tokens // ps, len(seq.pages)):
            page = seq.pages[idx]
            valid = max(0, num_tokens - idx * ps)
            if page.num_valid > valid:
                self.table.truncate(page, valid)
        seq.num_computed = min(seq.num_computed, num_tokens)

    def free(self, seq: ManagedSeq) -> None:
        """Release a sequence's pages (finished or cancelled); their KV stays cached until the pages are reused."""
        ps = self.page_size
        if seq.may_rewind:
            for idx in range(min(seq.num_computed // ps, len(seq.pages))):
                if seq.pages[idx].num_valid == ps:
                    self._name_page(seq, idx)
        for h in [h for h, s in self._planned.items() if s == seq.serial]:
            del self._planned[h]
        if self.window is not None:
            self.window.release_all(seq)
        for page in seq.pages:
            self.table.release(page)
        seq.pages = []

    def _may_name(self, seq: ManagedSeq, pos: int) -> bool:
        # Rows that a banned-string rewind may recompute (from the last prompt token on) are named at free().
        return not seq.may_rewind or pos < seq.prompt_len - 1

    def _name_page(self, seq: ManagedSeq, idx: int) -> None:
        page = seq.pages[idx]
        if page.hash is not None:
            return
        h = self.table.register_full(page)
        if self.disk is not None:
            self._named.append(DiskPage(page.page_id, h, page.prev_hash, tuple(page.token_ids), page.slot))
        if self._planned.get(h) == seq.serial:
            del self._planned[h]
        if idx + 1 < len(seq.pages):
            self.table.reparent(seq.pages[idx + 1], h)
