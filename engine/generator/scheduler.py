"""Admission, prefix reuse and page bookkeeping for the dynamic generator. Ids and counts only, no tensors.

Life of a sequence: waiting -> admitted (pages matched, copied or allocated for prompt + max_new_tokens, so
a running job never runs out of pages) -> prefill chunks -> one token per step -> finished (pages released;
their KV stays cached for later prompts until the pages are reused).

A CFG job has two sequences with its serial: the positive one, which waits in the queue, and its `negative`
(a shadow: never queued on its own). They are admitted together or not at all, their logits steps are planned
into the same forward, every generated token is appended to both, and they rewind and finish together.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.cache.page_table import ROOT_HASH, Page, PageTable, chain_hash
from engine.vision.embedding import is_mm_id


@dataclass
class Seq:
    """The scheduler's view of a job."""

    serial: int
    tokens: list[int]  # prompt + generated; the newest generated token is not in the cache yet
    prompt_len: int
    max_new_tokens: int
    max_skips: int
    may_rewind: bool = False  # banned strings can undo generated tokens, so their pages are named late
    pages: list[Page] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V rows are valid in the cache
    cached_tokens: int = 0  # prompt tokens reused from the cache at admission
    cached_pages: int = 0
    skips: int = 0
    admitted: bool = False
    negative: Seq | None = None  # a CFG job's negative-prompt sequence, moved in lockstep with this one
    shadow: bool = False  # this is such a negative sequence

    @property
    def group(self) -> list[Seq]:
        """This sequence and its CFG negative, if any."""
        return [self] if self.negative is None else [self, self.negative]

    @property
    def total_tokens(self) -> int:
        return self.prompt_len + self.max_new_tokens


@dataclass(frozen=True)
class Step:
    """This iterate's work for one sequence: feed tokens[start:start + len(token_ids)]."""

    seq: Seq
    start: int
    token_ids: list[int]
    needs_logits: bool


@dataclass(frozen=True)
class PageCopy:
    src: int
    dst: int
    num_tokens: int


class Scheduler:
    def __init__(self, page_table: PageTable, max_batch_size: int, max_chunk_size: int):
        self.table = page_table
        self.max_batch_size = max_batch_size
        self.max_chunk_size = max_chunk_size
        self.waiting: deque[Seq] = deque()
        self.active: list[Seq] = []
        self._planned: dict[int, int] = {}  # chain hash of a prompt page being prefilled -> serial
        self._copy_sources: list[Page] = []

    # --- admission ---------------------------------------------------------------------------------------

    def pages_needed(self, seq: Seq) -> int:
        return self.table.pages_for(seq.total_tokens)

    def admit(self) -> tuple[list[Seq], list[PageCopy]]:
        """Admit waiting sequences FIFO; a later one may pass one that does not fit, at most max_skips times."""
        admitted: list[Seq] = []
        copies: list[PageCopy] = []
        passed: list[Seq] = []
        for seq in list(self.waiting):
            if len(self.active) >= self.max_batch_size:
                break
            if any(p.skips >= p.max_skips for p in passed):
                break  # someone ahead was passed over often enough: it goes first
            result = self._try_admit(seq) if seq.negative is None else self._try_admit_pair(seq)
            if result is None:
                passed.append(seq)
                continue
            self.waiting.remove(seq)
            for p in passed:
                p.skips += 1
            self.active.extend(seq.group)
            admitted.append(seq)
            copies.extend(result)
        return admitted, copies

    def _try_admit(self, seq: Seq, reserve: int = 0, check_planned: bool = True) -> list[PageCopy] | None:
        """Match, copy and allocate a sequence's pages, leaving `reserve` free pages; None if it must wait."""
        ps = self.table.page_size
        # The last prompt token is always recomputed: it produces the first logits.
        reusable = seq.prompt_len - 1
        matched = self.table.match_full_pages(seq.tokens, reusable)
        prev = matched[-1].hash if matched else ROOT_HASH
        done = len(matched) * ps
        # Another job is computing our next full page right now: wait for it rather than compute it twice.
        if check_planned and done + ps <= reusable and chain_hash(prev, seq.tokens[done : done + ps]) in self._planned:
            return None
        num_new = self.pages_needed(seq) - len(matched)
        free_after_match = self.table.num_free - sum(1 for p in matched if p.ref_count == 0)
        if num_new + reserve > free_after_match:
            return None
        for page in matched:
            self.table.acquire(page)
        source, num_copy = self.table.best_partial(prev, seq.tokens[done:], min(ps, reusable - done))
        if source is not None and num_copy > 0:
            if source.ref_count == 0 and free_after_match - 1 < num_new + reserve:
                source, num_copy = None, 0  # holding the source would starve the allocation
            else:
                self.table.acquire(source)  # keep it from being reused before the copy happens
                self._copy_sources.append(source)
        new_pages: list = []
        for i in range(num_new):
            before = new_pages[-1] if new_pages else (matched[-1] if matched else None)
            after = before.page_id if before is not None else None
            new_pages.append(self.table.allocate(prev if i == 0 else ROOT_HASH, seq.serial, after=after))
        seq.pages = matched + new_pages
        copies = []
        if source is not None and num_copy > 0:
            new_pages[0].token_ids = list(seq.tokens[done : done + num_copy])
            copies.append(PageCopy(source.page_id, new_pages[0].page_id, num_copy))
        seq.num_computed = done + num_copy
        seq.cached_tokens = seq.num_computed
        seq.cached_pages = len(matched) + (1 if num_copy else 0)
        seq.admitted = True
        # Announce the prompt pages this sequence will compute, so a twin prompt waits instead of duplicating.
        h = prev
        for start in range(done, reusable - ps + 1, ps):
            h = chain_hash(h, seq.tokens[start : start + ps])
            self._planned.setdefault(h, seq.serial)
        return copies

    def _try_admit_pair(self, seq: Seq) -> list[PageCopy] | None:
        """Admit a CFG job's two sequences together or neither: a half holding pages while the other half waits
        could leave two such jobs each waiting for the other's pages."""
        pair = seq.group
        if len(self.active) + len(pair) > self.max_batch_size or any(self._waits_for_planned(s) for s in pair):
            return None
        matches = [self.table.match_full_pages(s.tokens, s.prompt_len - 1) for s in pair]
        num_new = [self.pages_needed(s) - len(m) for s, m in zip(pair, matches)]
        # Hold both matches while admitting, so the first half's allocations cannot evict the second's prefix.
        held = [p for m in matches for p in m]
        for page in held:
            self.table.acquire(page)
        copies = None
        if sum(num_new) <= self.table.num_free:
            # Pages the first half announces may hold the second's prefix: both compute it rather than wait.
            copies = self._try_admit(pair[0], reserve=num_new[1], check_planned=False)
            second = self._try_admit(pair[1], check_planned=False) if copies is not None else None
            if copies is not None and second is None:
                raise RuntimeError(f"CFG job {seq.serial}: its negative sequence did not fit after the page check")
            copies = None if copies is None else copies + second
        for page in held:
            self.table.release(page)
        return copies

    def _waits_for_planned(self, seq: Seq) -> bool:
        """Another sequence is computing this one's next full prompt page right now."""
        ps, reusable = self.table.page_size, seq.prompt_len - 1
        matched = self.table.match_full_pages(seq.tokens, reusable)
        prev, done = (matched[-1].hash if matched else ROOT_HASH), len(matched) * ps
        return done + ps <= reusable and chain_hash(prev, seq.tokens[done : done + ps]) in self._planned

    def copies_done(self) -> None:
        """The generator executed the page copies returned by admit(): drop the sources' temporary holds."""
        for page in self._copy_sources:
            self.table.release(page)
        self._copy_sources.clear()

    # --- planning and committing -------------------------------------------------------------------------

    def plan(self) -> list[Step]:
        """Prefill chunks and decode tokens of every active sequence for one forward pass."""
        steps = []
        for seq in self.active:
            if seq.shadow:
                continue  # planned with its positive sequence
            group = [self._step(s) for s in seq.group]
            # A CFG job's two logits rows are mixed, so they come from the same forward: a half whose last
            # prefill chunk is ready waits for the other half's.
            paired = all(step is not None and step.needs_logits for step in group)
            steps += [step for step in group if step is not None and (not step.needs_logits or paired)]
        return steps

    def _step(self, seq: Seq) -> Step | None:
        n = min(len(seq.tokens) - seq.num_computed, self.max_chunk_size)
        if n <= 0:
            return None
        start = seq.num_computed
        n = _keep_images_whole(seq.tokens, start, n)
        return Step(seq, start, seq.tokens[start : start + n], start + n == len(seq.tokens))

    def commit(self, step: Step) -> None:
        """The forward wrote K/V rows for this step's tokens: record them and name pages that became full."""
        seq, ps = step.seq, self.table.page_size
        for pos in range(step.start, step.start + len(step.token_ids)):
            page = seq.pages[pos // ps]
            page.token_ids.append(seq.tokens[pos])
            if len(page.token_ids) == ps and self._may_name(seq, pos):
                self._name_page(seq, pos // ps)
        seq.num_computed = step.start + len(step.token_ids)

    def _may_name(self, seq: Seq, pos: int) -> bool:
        # Rows that a banned-string rewind may recompute (from the last prompt token on) are named at the end.
        return not seq.may_rewind or pos < seq.prompt_len - 1

    def _name_page(self, seq: Seq, idx: int) -> None:
        page = seq.pages[idx]
        if page.hash is not None:
            return
        h = self.table.register_full(page)
        if self._planned.get(h) == seq.serial:
            del self._planned[h]
        if idx + 1 < len(seq.pages):
            self.table.reparent(seq.pages[idx + 1], h)

    def append(self, seq: Seq, token_id: int) -> None:
        for s in seq.group:  # a CFG negative mirrors the generated tokens
            s.tokens.append(token_id)

    def rewind(self, seq: Seq, num_generated: int) -> None:
        """Keep only the first `num_generated` generated tokens; the last kept token is fed again for logits."""
        keep = seq.prompt_len + num_generated
        del seq.tokens[keep:]
        recompute_from = keep - 1
        ps = self.table.page_size
        for idx in range(recompute_from // ps, len(seq.pages)):
            page = seq.pages[idx]
            valid = max(0, recompute_from - idx * ps)
            if page.num_valid > valid:
                self.table.truncate(page, valid)
        seq.num_computed = min(seq.num_computed, recompute_from)
        if seq.negative is not None:
            self.rewind(seq.negative, num_generated)

    # --- leaving -----------------------------------------------------------------------------------------

    def finish(self, seq: Seq, keep_cache: bool = True) -> None:
        """Release a sequence's pages (finished or cancelled, waiting or active)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        if seq not in self.active:
            return
        self.active.remove(seq)
        ps = self.table.page_size
        if keep_cache and seq.may_rewind:
            for idx in range(min(seq.num_computed // ps, len(seq.pages))):
                if seq.pages[idx].num_valid == ps:
                    self._name_page(seq, idx)
        for h in [h for h, s in self._planned.items() if s == seq.serial]:
            del self._planned[h]
        for page in seq.pages:
            self.table.release(page)
        seq.pages = []
        if seq.negative is not None:
            self.finish(seq.negative, keep_cache)


def _keep_images_whole(tokens: list[int], start: int, n: int) -> int:
    """The length of a prefill chunk tokens[start:start + n] moved so it does not end inside an image's id run.

    Some models let an image's tokens attend to each other both ways (Gemma 3), which needs the whole run in
    one forward. The chunk ends before the run instead; when the run begins at the chunk's start (or earlier,
    its first part cached), the chunk grows to the run's end, past max_chunk_size by less than one image.
    """
    end = start + n

    def continues(i: int) -> bool:  # tokens[i] is the next id of the image run holding tokens[i - 1]
        return is_mm_id(tokens[i]) and tokens[i] == tokens[i - 1] + 1

    if end >= len(tokens) or not continues(end):
        return n
    run_start = end - 1
    while run_start > start and continues(run_start):
        run_start -= 1
    if run_start > start:
        return run_start - start
    while end < len(tokens) and continues(end):
        end += 1
    return end - start
