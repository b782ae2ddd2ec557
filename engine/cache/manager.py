"""The cache's manager: the one object the scheduler asks for cache memory. Ids and counts only, no tensors.

    scheduler asks                    the manager does (PageTable underneath)
    lookup(prompt_ids)          ->    cached full pages of the prompt, and whether its next one is being computed
    allocate(seqs, n, hits)     ->    hold the hits, plan a copy of a partly matching page, fresh pages for the
                                      rest: all the sequences or none
    commit(seq, num_tokens)     ->    record the rows the forward wrote; name pages that became full
    rewind(seq, num_tokens)     ->    drop rows past num_tokens (they are recomputed)
    step(seq, start, end)       ->    before a forward: move windows, set a recurrent state aside for drafts
    free(seq)                   ->    name late pages, release every page (their KV stays cached)

With a disk tier (a PageStore), lookup() also finds the prompt's next full pages on disk; allocate() gives them
fresh pages and plans their loads (take_loads, then loads_done: a page that fails to load is computed instead),
and pages named from then on wait in take_named() for the caller to write.

A sequence's memory is one page list for its attention layers. Sliding-window layers, when the cache keeps
them apart (a WindowSlots, window.py), hold slots only for the pages their window sees: allocate() reserves a
sequence's quota, step(seq, start, end) moves its window before each forward, and lookup() cuts a prefix hit back
to a point whose window still has its rows. Other kinds of layer memory belong behind these same calls, so the
scheduler keeps seeing sequences and token counts only.

Linear-attention layers (a StateSlots, recurrent.py) hold a recurrent-state slot per sequence, whose state is
after one token only, so their pages are worth resuming from only where a copy of that state was kept:

    commit()   the state is exactly at a page boundary (step_room() ends prefill chunks there, draft_room() ends
               drafts there): keep a snapshot under the page's chain hash
    free()     keep the state after the rows of the last, partly full page (the finished turn's tail)
    lookup()   the tail after the matched pages, when the prompt continues it (its page is taken over, rows and
               state, by allocate()), else the deepest matched page with a snapshot; never the disk tier
    rewind()   restore the deepest kept state at or before the rewind point (the sequence's spare, a snapshot,
               or the zero state at token 0) and drop the rows after it, which are computed again
    step()     a step feeding drafts first sets the state before them aside; settle() restores it after a
               verify step that rejected some

The copies between slots wait in take_state_copies() for the caller to run, in order, before the next forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.cache.page_table import ROOT_HASH, Page, PageTable, chain_hash
from engine.cache.recurrent import StateCopy, StateSlots
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
    state_slot: int  # its recurrent-state slot (recurrent.py), -1 when none
    spare_slot: int  # a second slot for the state a rewind returns to, -1 when none
    state_at: int  # tokens the state in its slot has taken in (past num_computed while drafts are verified)
    spare_at: int  # tokens the state in its spare has taken in, -1 when it holds none


@dataclass(frozen=True)
class PrefixHit:
    """What the cache holds of a prompt: full pages covering its start (the last token is never among them). For a
    model with recurrent state, `pages` may end with a partly full page that no sequence holds, whose rows up to
    num_tokens are taken over with the snapshot of the state after them (a finished turn's tail)."""

    pages: tuple[Page, ...]
    prev_hash: int  # chain hash after those pages (and the disk pages)
    num_tokens: int
    pending: bool  # another sequence is computing the prompt's next full page right now
    disk_hashes: tuple[int, ...] = ()  # full pages after `pages` that the disk tier holds (counted in num_tokens)
    state_hash: int | None = None  # the snapshot of the recurrent state at num_tokens to resume from (None: none)


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
        self,
        num_pages: int,
        page_size: int,
        disk: PageStore | None = None,
        window: WindowSlots | None = None,
        states: StateSlots | None = None,
        speculative: bool = False,
    ):
        self.window = window
        self.states = states
        self.speculative = speculative  # decode steps feed drafts: every sequence keeps a spare state slot
        self.table = PageTable(num_pages, page_size, on_forget=window.forget if window is not None else None)
        self.page_size = page_size
        self.disk = disk
        self._planned: dict[int, int] = {}  # chain hash of a prompt page being prefilled -> serial
        self._copy_sources: list[Page] = []
        self._loads: list[tuple[ManagedSeq, int, DiskPage]] = []  # (sequence, page index, page) to fill from disk
        self._named: list[DiskPage] = []  # pages named since take_named(), for the disk tier
        self._state_copies: list[StateCopy] = []  # slot copies to run before the next forward, in order

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
        if self.states is not None:
            return self._state_lookup(prompt_ids, matched, reusable)
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

    def _state_lookup(self, prompt_ids: Sequence[int], matched: list[Page], reusable: int) -> PrefixHit:
        """The deepest point of the prompt whose recurrent state was kept: the end of a finished sequence's rows
        in the partly full page after the matched ones (its tail, kept at free()), else the deepest matched page
        with a snapshot. The disk tier is not read: it keeps no state."""
        ps = self.page_size
        prev = matched[-1].hash if matched else ROOT_HASH
        done = len(matched) * ps
        source, n = self.table.best_partial(prev, prompt_ids[done:], min(ps, reusable - done))
        if source is not None and n > 0 and source.ref_count == 0:
            tail = chain_hash(prev, prompt_ids[done : done + n])
            if self.states.has(tail):
                return PrefixHit((*matched, source), prev, done + n, False, state_hash=tail)
        while matched and not self.states.has(matched[-1].hash):
            matched.pop()
        prev = matched[-1].hash if matched else ROOT_HASH
        done = len(matched) * ps
        pending = done + ps <= reusable and chain_hash(prev, prompt_ids[done : done + ps]) in self._planned
        return PrefixHit(tuple(matched), prev, done, pending, state_hash=prev if matched else None)

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
        if self.states is not None:
            hits = self._one_taker_per_tail(hits)
        needed = [self.pages_for(n) - len(hit.pages) for n, hit in zip(num_tokens, hits)]
        held = {p.page_id: p for hit in hits for p in hit.pages}
        if sum(needed) > self.num_free - sum(1 for p in held.values() if p.ref_count == 0):
            return None
        if self.window is not None and not self.window.can_reserve(
            self._quota(seq, n, hit) for seq, n, hit in zip(seqs, num_tokens, hits)
        ):
            return None
        if self.states is not None:
            resumed = {hit.state_hash for hit in hits if hit.state_hash is not None}
            if not self.states.can_take(len(seqs), sum(map(self._wants_spare, seqs)), resumed):
                return None
            self.states.pin(resumed)  # one sequence's slots must not evict the snapshot another resumes from
        # Hold every hit while allocating, so one sequence's fresh pages cannot evict another's prefix.
        for page in held.values():
            self.table.acquire(page)
        copies: list[PageCopy] = []
        for i, (seq, hit) in enumerate(zip(seqs, hits)):
            copies += self._allocate_one(seq, hit, needed[i], reserve=sum(needed[i + 1 :]))
        for page in held.values():
            self.table.release(page)
        if self.states is not None:
            self.states.unpin()
        return copies

    def _allocate_one(self, seq: ManagedSeq, hit: PrefixHit, num_new: int, reserve: int) -> list[PageCopy]:
        """Take the hit's pages, a partial-page copy when one is worth it, and `num_new` fresh pages."""
        ps = self.page_size
        reusable = seq.prompt_len - 1
        done, prev = hit.num_tokens, hit.prev_hash
        for page in hit.pages:
            self.table.acquire(page)
        if done % ps:  # a finished sequence's partly full page, taken over with the state after its rows
            self._take_over(seq, hit.pages[-1], done % ps)
        source, num_copy = self.table.best_partial(prev, seq.tokens[done:], min(ps, reusable - done))
        if source is not None and self.window is not None and not self.window.has_rows(source):
            source, num_copy = None, 0  # its sliding-window layers' rows are gone
        if self.states is not None:
            source, num_copy = None, 0  # rows without the recurrent state after them resume nothing
        if source is not None and num_copy > 0:
            if source.ref_count == 0 and self.num_free - 1 < num_new + reserve:
                source, num_copy = None, 0  # holding the source would starve the allocation
            else:
                self.table.acquire(source)  # keep it from being reused before the copy happens
                self._copy_sources.append(source)
        # Pages loaded from disk come first; each follows the one before, so its prev_hash is known now.
        num_disk = len(hit.disk_hashes)
        chain = [hit.pages[-1].hash if hit.pages and not done % ps else ROOT_HASH, *hit.disk_hashes]
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
        if self.states is not None:
            self._take_state(seq, hit)
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
        for start in range(done - done % ps, reusable - ps + 1, ps):
            h = chain_hash(h, seq.tokens[start : start + ps])
            self._planned.setdefault(h, seq.serial)
        return copies

    def _take_over(self, seq: ManagedSeq, page: Page, num_rows: int) -> None:
        page.owner = seq.serial
        if page.num_valid > num_rows:
            self.table.truncate(page, num_rows)

    def _one_taker_per_tail(self, hits: Sequence[PrefixHit]) -> list[PrefixHit]:
        """Hits of one admission that would take over the same partly full page: the first keeps it, the others
        start cold (a page is extended by one sequence only)."""
        taken: set[int] = set()
        kept = []
        for hit in hits:
            if hit.num_tokens % self.page_size and hit.pages[-1].page_id in taken:
                hit = PrefixHit((), ROOT_HASH, 0, False)
            elif hit.num_tokens % self.page_size:
                taken.add(hit.pages[-1].page_id)
            kept.append(hit)
        return kept

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
        """Before a forward writing positions [start, end) of `seq`: move its window (see window.py); past its
        tokens (drafts to verify), keep its state at `start` in its spare slot."""
        if self.window is not None:
            self.window.step(seq, start, end)
        if self.states is not None:
            if seq.state_at != start:
                raise RuntimeError(
                    f"sequence {seq.serial}'s recurrent state is after token {seq.state_at} but its step starts at "
                    f"{start}; a rewind or settle() was missed"
                )
            if end > len(seq.tokens) and seq.spare_slot >= 0:
                self._state_copies.append(StateCopy(seq.state_slot, seq.spare_slot))
                seq.spare_at = start
            seq.state_at = end

    def step_room(self, seq: ManagedSeq) -> int | None:
        """The most tokens the next step of `seq` may feed within its window quota, and for a model with
        recurrent state up to the next page boundary, where commit() keeps a snapshot (None: no such bound)."""
        room = None if self.window is None else self.window.room(seq)
        if self.states is not None:
            to_boundary = self.page_size - seq.num_computed % self.page_size
            room = to_boundary if room is None else min(room, to_boundary)
        return room

    def draft_room(self, seq: ManagedSeq) -> int | None:
        """The most tokens a decode step of `seq` may draft (None: no bound here): for a model with recurrent state,
        up to the next page boundary, so that accepting them all leaves the state there for a snapshot; none for a
        sequence that may rewind (banned strings), whose spare keeps the state its rewinds return to."""
        if self.states is None:
            return None
        return 0 if seq.may_rewind else self.page_size - 1 - seq.num_computed % self.page_size

    def take_state_copies(self) -> list[StateCopy]:
        """Recurrent-state copies (snapshots taken and restored) to run, in this order, before the next forward."""
        copies, self._state_copies = self._state_copies, []
        return copies

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
        if self.states is not None and num_tokens > seq.num_computed and num_tokens == seq.state_at:
            if num_tokens % ps == 0:
                self._snapshot(seq, num_tokens)
        seq.num_computed = num_tokens

    def settle(self, seq: ManagedSeq) -> None:
        """After a verify step: a state that took in rejected drafts goes back to the last accepted token."""
        if self.states is not None and seq.state_slot >= 0 and seq.state_at > seq.num_computed:
            self.rewind(seq, seq.num_computed)

    def rewind(self, seq: ManagedSeq, num_tokens: int) -> None:
        """Keep only the K/V rows of the first `num_tokens` tokens; the rest are computed again (for a model with
        recurrent state, from the deepest point at or before `num_tokens` whose state was kept)."""
        ps = self.page_size
        if self.states is not None and num_tokens < seq.state_at:
            num_tokens = self._restore(seq, num_tokens)
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
        if self.states is not None:
            self._keep_tail(seq)
            self.states.release(seq)
        for page in seq.pages:
            self.table.release(page)
        seq.pages = []

    # --- recurrent state ---------------------------------------------------------------------------------

    def _wants_spare(self, seq: ManagedSeq) -> bool:
        return self.speculative or seq.may_rewind

    def slots_needed(self, may_rewind: bool, num_seqs: int = 1) -> int:
        """Recurrent-state slots `num_seqs` sequences of a job hold (0 without such state)."""
        if self.states is None:
            return 0
        return num_seqs * (2 if self.speculative or may_rewind else 1)

    def _take_state(self, seq: ManagedSeq, hit: PrefixHit) -> None:
        """Slots for an admitted sequence; its state is the hit's snapshot, copied in (zero for a cold start)."""
        self.states.take(seq, spare=self._wants_spare(seq))
        if hit.state_hash is not None:
            src = self.states.snapshot(hit.state_hash)
            self._state_copies.append(StateCopy(src, seq.state_slot))
            seq.state_at = hit.num_tokens
            self._keep_floor(seq, src)

    def _keep_floor(self, seq: ManagedSeq, src: int) -> None:
        """A sequence that may rewind keeps in its spare its state at the page boundary before its last prompt
        token, or later in that page: no banned-string rewind goes back past it, and the pages from there on are
        its own (a rewind that recomputes rows never writes into a page another sequence reads)."""
        floor = (seq.prompt_len - 1) // self.page_size * self.page_size
        if seq.may_rewind and seq.spare_slot >= 0 and seq.spare_at < 0 and 0 < seq.state_at:
            if floor <= seq.state_at <= seq.prompt_len - 1:
                self._state_copies.append(StateCopy(src, seq.spare_slot))
                seq.spare_at = seq.state_at

    def _snapshot(self, seq: ManagedSeq, boundary: int) -> None:
        """The state is exactly at page boundary `boundary`: keep a copy under that page's chain hash."""
        slot = self.states.keep(self._chain_hashes(seq, boundary // self.page_size)[-1])
        if slot is not None:
            self._state_copies.append(StateCopy(seq.state_slot, slot))
        self._keep_floor(seq, seq.state_slot)

    def _keep_tail(self, seq: ManagedSeq) -> None:
        """At free(): keep the state after the rows of a partly full last page, keyed by the chain and those rows'
        tokens; lookup() resumes a prompt that continues the sequence (its next chat turn) there."""
        ps, end = self.page_size, seq.num_computed
        if seq.state_slot < 0 or seq.state_at != end or end % ps == 0:
            return
        prev = self._chain_hashes(seq, end // ps)[-1] if end >= ps else ROOT_HASH
        slot = self.states.keep(chain_hash(prev, seq.tokens[end - end % ps : end]))
        if slot is not None:
            self._state_copies.append(StateCopy(seq.state_slot, slot))

    def _restore(self, seq: ManagedSeq, num_tokens: int) -> int:
        """Put the deepest kept state at or before token `num_tokens` into the sequence's slot: its spare's, a
        snapshot at a page boundary, or the zero state before token 0. Returns where it is."""
        ps = self.page_size
        best, src = 0, None
        if seq.spare_slot >= 0 and 0 <= seq.spare_at <= num_tokens:
            best, src = seq.spare_at, seq.spare_slot
        if num_tokens // ps * ps > best:
            hashes = self._chain_hashes(seq, num_tokens // ps)
            for idx in range(len(hashes) - 1, best // ps - 1, -1):
                slot = self.states.snapshot(hashes[idx])
                if slot is not None:
                    best, src = (idx + 1) * ps, slot
                    break
        if src is not None:
            self._state_copies.append(StateCopy(src, seq.state_slot))
        seq.state_at = best
        return best

    def _chain_hashes(self, seq: ManagedSeq, num_pages: int) -> list[int]:
        """The chain hash of each of the sequence's first `num_pages` pages, from its tokens (named pages give
        theirs: a page is named late when its sequence may rewind)."""
        ps = self.page_size
        hashes: list[int] = []
        prev = ROOT_HASH
        for idx in range(num_pages):
            page = seq.pages[idx]
            prev = page.hash if page.hash is not None else chain_hash(prev, seq.tokens[idx * ps : (idx + 1) * ps])
            hashes.append(prev)
        return hashes

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
