"""Policy of the dynamic generator: admission order, skips, CFG pairs, chunking and a token budget per step.
Ids and counts only, no tensors; which pages hold what is the cache manager's (engine/cache/manager.py).

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

from engine.cache.manager import CacheManager, PageCopy
from engine.cache.page_table import Page
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
    max_step: int = 2048  # the most tokens a prefill step feeds: max_chunk_size, widened to keep an image whole
    slots_held: set[int] = field(default_factory=set)  # pages whose sliding-window slot it holds (cache/window.py)
    window_quota: int = 0
    state_slot: int = -1  # its recurrent-state slot, for a hybrid model's linear layers (cache/recurrent.py)
    spare_slot: int = -1  # a second one, for the state a rewind returns to
    state_at: int = 0  # tokens the state in its slot has taken in
    spare_at: int = -1  # tokens the state in its spare has taken in (-1: none)
    cached_tokens: int = 0  # prompt tokens reused from the cache at admission
    cached_pages: int = 0
    skips: int = 0
    admitted: bool = False
    priority: int = 0  # higher is admitted first (DynamicJob.priority)
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


class Scheduler:
    """Decides which sequences run and what each feeds per forward; asks the cache manager for their pages.

    A step feeds at most `max_step_tokens` tokens (default: `max_batch_size * max_chunk_size`, which full
    batches of full chunks reach): single-token steps (decoding) are counted first, and prefill chunks, at most
    `max_chunk_size` each, share what they leave in admission order (an image's id run is never split, so a chunk
    may pass both by less than one image).
    """

    def __init__(
        self, cache: CacheManager, max_batch_size: int, max_chunk_size: int, max_step_tokens: int | None = None
    ):
        self.cache = cache
        self.max_batch_size = max_batch_size
        self.max_chunk_size = max_chunk_size
        self.max_step_tokens = max_step_tokens or max_batch_size * max_chunk_size
        if self.max_step_tokens < max_batch_size:
            # Fewer could leave no token for any prefill once every other sequence decodes.
            raise ValueError(
                f"max_step_tokens ({self.max_step_tokens}) must be at least max_batch_size ({max_batch_size}), "
                "so a step holds every decoding sequence and one prefill token; raise it or lower max_batch_size"
            )
        self.waiting: deque[Seq] = deque()
        self.active: list[Seq] = []

    # --- admission ---------------------------------------------------------------------------------------

    def admit(self) -> tuple[list[Seq], list[PageCopy]]:
        """Admit waiting sequences by priority, then FIFO; a later one may pass one that does not fit, at most
        max_skips times."""
        admitted: list[Seq] = []
        copies: list[PageCopy] = []
        passed: list[Seq] = []
        for seq in sorted(self.waiting, key=lambda s: -s.priority):  # stable: FIFO within a priority
            if len(self.active) >= self.max_batch_size:
                break
            if any(p.skips >= p.max_skips for p in passed):
                break  # someone ahead was passed over often enough: it goes first
            result = self._try_admit(seq)
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

    def _try_admit(self, seq: Seq) -> list[PageCopy] | None:
        """Pages for a sequence (with its CFG negative: both or neither, since a half holding pages while the
        other waits could leave two such jobs each waiting for the other's); None if it must wait."""
        group = seq.group
        if len(self.active) + len(group) > self.max_batch_size:
            return None
        hits = [self.cache.lookup(s.tokens[: s.prompt_len]) for s in group]
        if any(hit.pending for hit in hits):
            return None  # another sequence is computing a next prompt page: wait rather than compute it twice
        # Pages for prompt + max_new_tokens up front, so a running sequence never runs out of them.
        copies = self.cache.allocate(group, [s.total_tokens for s in group], hits)
        if copies is None:
            return None
        for s in group:
            s.cached_tokens = s.num_computed
            s.cached_pages = self.cache.pages_for(s.num_computed)
            s.admitted = True
        return copies

    # --- planning and committing -------------------------------------------------------------------------

    def plan(self) -> list[Step]:
        """Prefill chunks and decode tokens of every active sequence for one forward pass, within the budget."""
        budget = self.max_step_tokens - sum(1 for s in self.active if len(s.tokens) - s.num_computed == 1)
        steps = []
        for seq in self.active:
            if seq.shadow:
                continue  # planned with its positive sequence
            group = []
            for s in seq.group:
                group.append(self._step(s, budget - sum(_prefill_tokens(step) for step in group)))
            # A CFG job's two logits rows are mixed, so they come from the same forward: a half whose last
            # prefill chunk is ready waits for the other half's.
            paired = all(step is not None and step.needs_logits for step in group)
            kept = [step for step in group if step is not None and (not step.needs_logits or paired)]
            budget -= sum(_prefill_tokens(step) for step in kept)
            steps += kept
        return steps

    def _step(self, seq: Seq, budget: int) -> Step | None:
        """The sequence's next chunk; a single token (a decode step) is counted in the budget already."""
        remaining = len(seq.tokens) - seq.num_computed
        n = remaining if remaining <= 1 else min(remaining, self.max_chunk_size, budget)
        room = self.cache.step_room(seq)  # its sliding-window quota; a hybrid model's next page boundary
        n = n if room is None else min(n, room)
        if n <= 0:
            return None
        start = seq.num_computed
        n = _keep_images_whole(seq.tokens, start, n)
        return Step(seq, start, seq.tokens[start : start + n], start + n == len(seq.tokens))

    def commit(self, step: Step) -> None:
        """The forward wrote K/V rows for this step's tokens: the cache records them."""
        self.cache.commit(step.seq, step.start + len(step.token_ids))

    def append(self, seq: Seq, token_id: int) -> None:
        for s in seq.group:  # a CFG negative mirrors the generated tokens
            s.tokens.append(token_id)

    def settle(self, seq: Seq) -> None:
        """After a verify step: the cache drops what rejected drafts left in a recurrent state."""
        self.cache.settle(seq)

    def rewind(self, seq: Seq, num_generated: int) -> None:
        """Keep only the first `num_generated` generated tokens; the last kept token is fed again for logits."""
        keep = seq.prompt_len + num_generated
        del seq.tokens[keep:]
        self.cache.rewind(seq, keep - 1)
        if seq.negative is not None:
            self.rewind(seq.negative, num_generated)

    # --- leaving -----------------------------------------------------------------------------------------

    def finish(self, seq: Seq) -> None:
        """Release a sequence's pages (finished or cancelled, waiting or active)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        if seq not in self.active:
            return
        self.active.remove(seq)
        self.cache.free(seq)
        if seq.negative is not None:
            self.finish(seq.negative)


def _prefill_tokens(step: Step | None) -> int:
    """Tokens a step takes from the budget's prefill share (a sequence's last single token was counted up front)."""
    return 0 if step is None or (step.needs_logits and len(step.token_ids) == 1) else len(step.token_ids)


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
