"""Speculative decoding: draft tokens cheaply, verify them all in one forward of the main model.

    generator.iterate():  drafts = drafter.propose(jobs)        n-gram lookup or a draft model's argmax
                          logits = model([t, d_1..d_k] per job)  one forward, k + 1 rows per drafting job
                          drafter.verify(job, rows, draft)       the rule below, token by token

A draft proposes k tokens d_1..d_k after a job's newest token t. The main model runs [t, d_1..d_k] as one
query chunk and yields k + 1 logits rows; row i is the distribution p_i the job would sample from had
d_1..d_i been generated. Both drafters here propose one token per position deterministically, i.e. q_i is a
point mass on d_i, so the standard rule (Leviathan et al., accept with min(1, p/q)) reduces to:

    greedy:  accept d_i while argmax(p_i) == d_i; the first mismatch emits argmax(p_i) instead.
    sampled: accept d_i with probability p_i(d_i); on rejection draw from p_i with d_i removed and
             renormalised:  P(x) = (1 - p(d)) * p(x) / (1 - p(d)) = p(x) for x != d,  P(d) = p(d).

so every emitted token has exactly the distribution of non-speculative sampling. When all k drafts are
accepted, row k gives one more token for free. Random numbers come from the job's seeded generator.

A hybrid model's recurrent state (engine/cache/recurrent.py) takes in every fed draft. The cache manager sets the
state before them aside (its step()), and after a verify step that rejected some, settle() puts it back: the
accepted tokens are computed again with the next token. Drafts stop at page boundaries (the manager's
draft_room()), so a step that keeps them all leaves the state at the boundary, where a snapshot is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from engine.cache.cache import Cache
from engine.generator import sampler_steps as steps
from engine.generator.results import Result
from engine.generator.sampler import SamplerSettings, SamplerState, distribution
from engine.generator.scheduler import Scheduler, Seq, Step
from engine.generator.session import JobSession
from engine.models.batch import Batch

_CONCAT_TENSORS = ("token_ids", "token_probs", "top_k_tokens", "top_k_probs", "logits")


class Drafter:
    """Proposes the next tokens of decoding jobs, and verifies them against the main model's logits rows.

    Subclasses say how tokens are proposed (`_draft`); which jobs draft, how many tokens, and the
    accept/reject rule are the same for every drafter.
    """

    def __init__(self, num_draft_tokens: int, max_q_size: int, vocab_size: int):
        self.num_draft_tokens = num_draft_tokens
        self.max_q_size = max_q_size
        self.vocab_size = vocab_size  # drafts hold ids both models know
        # the most tokens a sequence may draft now, or None (the cache manager's draft_room)
        self.room: Callable[[Seq], int | None] | None = None

    def propose(self, jobs: Sequence[tuple[JobSession, Step]]) -> dict[int, list[int]]:
        """Drafted tokens per serial, for the steps of this iterate that may speculate (others are absent)."""
        wanted = [(step.seq, k) for session, step in jobs if (k := self.num_draft(session, step)) > 0]
        drafts = self._draft(wanted) if wanted else {}
        return {serial: d for serial, d in drafts.items() if d}

    def num_draft(self, session: JobSession, step: Step) -> int:
        """How many tokens to draft for this step; 0 where the job decodes one token at a time."""
        job = session.job
        if len(step.token_ids) != 1 or not step.needs_logits or not session.generated:
            return 0  # prefill, or the first token (token healing and min_new_tokens start there)
        if session.filters is not None or job.embeddings or job.negative_ids is not None:
            return 0  # filters keep grammar state; image jobs decode plainly (the draft has no images); CFG mixes
        settings = job.gen_settings
        if not settings.is_greedy and (settings.mirostat or job.return_top_tokens):
            return 0  # mirostat's mu and top-k reports need the sampler's own draw
        # The last draft must still leave room for the bonus token within max_new_tokens.
        k = min(self.num_draft_tokens, self.max_q_size - 1, job.max_new_tokens - len(session.generated) - 1)
        room = self.room(step.seq) if self.room is not None else None
        return max(0, k if room is None else min(k, room))

    def _draft(self, wanted: list[tuple[Seq, int]]) -> dict[int, list[int]]:
        """Up to k drafted ids per sequence of `wanted` (seq, k), keyed by serial."""
        raise NotImplementedError

    def forget(self, serial: int) -> None:
        """The job ended or was cancelled: drop what the drafter kept for it."""

    def verify(
        self, session: JobSession, step: Step, rows: torch.Tensor, draft: list[int], scheduler: Scheduler, now: float
    ) -> Result | None:
        """Take the accepted drafts and one more token through the job's per-token path; one merged result.

        `rows [len(draft) + 1, vocab]` are the main model's logits after the newest token and each draft. Each
        token goes through JobSession.accept exactly as in plain decoding, so stop tokens and strings,
        max_new_tokens and banned strings behave the same; row i is sampled after tokens 0..i-1 were taken.
        The caller ends the job when the merged result is its eos.
        """
        seq, settings = session.seq, session.job.gen_settings
        results: list[Result] = []
        num_accepted = 0
        ended = False
        for i in range(len(draft) + 1):
            # greedy: accept d_i iff argmax(p_i) == d_i, else emit the argmax. sampled: accept d_i with probability
            # p_i(d_i), else draw from p_i without d_i. Row k, reached when all k were accepted: a plain sample.
            if settings.is_greedy or i == len(draft):
                out = JobSession.sample_many([session], rows[i : i + 1])[0]
                hit = i < len(draft) and out[0] == draft[i]
            else:
                out, hit = verify_sampled(rows[i], settings, session.state, session.blocked(), draft[i])
            if i < len(draft):  # counted before accept(), whose eos result reports the totals
                num_accepted += hit
                session.num_accepted_draft += hit
                session.num_rejected_draft += 0 if hit else len(draft) - i
            result, rewind_to = session.accept(out, rows[i], now)
            if result is not None:
                results.append(result)
            if rewind_to is not None:
                scheduler.rewind(seq, rewind_to)
                ended = True
            else:
                scheduler.append(seq, session.generated[-1])
            if result is not None and result["eos"]:
                ended = True
            if ended or not hit:
                break
        if not ended and num_accepted:
            # The verify forward wrote the accepted drafts' K/V from the right context: record them.
            scheduler.commit(
                Step(seq, step.start + 1, seq.tokens[step.start + 1 : step.start + 1 + num_accepted], False)
            )
        if not ended:
            scheduler.settle(seq)  # a recurrent state that took in rejected drafts goes back
        return merge_results(results) if results else None


class NgramDrafter(Drafter):
    """Drafts what followed the last earlier occurrence of the job's newest tokens (prompt lookup)."""

    def __init__(self, num_draft_tokens: int, max_q_size: int, vocab_size: int, max_ngram: int):
        super().__init__(num_draft_tokens, max_q_size, vocab_size)
        self.max_ngram = max_ngram

    def _draft(self, wanted: list[tuple[Seq, int]]) -> dict[int, list[int]]:
        return {seq.serial: ngram_draft(seq.tokens, self.max_ngram, k, self.vocab_size) for seq, k in wanted}


class ModelDrafter(Drafter):
    """Greedy drafts from a smaller model, batched over jobs, with its own paged cache.

    The draft cache uses the job's page ids. Its K/V for a sequence are trusted only for the tokens this
    sequence fed the draft (`_known`) that still match the sequence, so rewinds, rejected drafts and pages
    filled from the prefix cache by the main model alone are recomputed.
    """

    def __init__(
        self, num_draft_tokens: int, max_q_size: int, vocab_size: int, model, cache: Cache, max_chunk_size: int
    ):
        super().__init__(num_draft_tokens, max_q_size, min(vocab_size, model.config.vocab_size))
        self.model = model
        self.cache = cache
        self.max_chunk_size = max_chunk_size
        self._known: dict[int, list[int]] = {}  # serial -> tokens whose draft-model K/V are in the draft cache

    def forget(self, serial: int) -> None:
        self._known.pop(serial, None)

    def _draft(self, wanted: list[tuple[Seq, int]]) -> dict[int, list[int]]:
        # k forwards per job; the first also catches up on the tokens the draft has not seen.
        past, feed, todo = {}, {}, {}
        for seq, k in wanted:
            known = self._known.get(seq.serial, [])
            valid = min(common_prefix(known, seq.tokens), len(seq.tokens) - 1)
            past[seq.serial], feed[seq.serial], todo[seq.serial] = valid, seq.tokens[valid:], k
            self._known[seq.serial] = seq.tokens[:valid]
        seqs = {seq.serial: seq for seq, _ in wanted}
        drafts: dict[int, list[int]] = {serial: [] for serial in seqs}
        # Catch up in chunks first (a new job's whole prompt), so one draft forward stays within max_chunk_size.
        while True:
            long = [s for s in seqs if len(feed[s]) > self.max_chunk_size]
            if not long:
                break
            chunks = {s: feed[s][: self.max_chunk_size] for s in long}
            self._forward([seqs[s] for s in long], past, chunks)
            for s in long:
                self._known[s] += chunks[s]
                past[s] += len(chunks[s])
                feed[s] = feed[s][self.max_chunk_size :]
        live = list(seqs)
        while live:
            logits = self._forward([seqs[s] for s in live], past, feed)
            next_ids = logits[:, : self.vocab_size].argmax(dim=-1).tolist()
            still = []
            for s, t in zip(live, next_ids):
                self._known[s] += feed[s]
                past[s] += len(feed[s])
                drafts[s].append(t)
                feed[s] = [t]
                if len(drafts[s]) < todo[s]:
                    still.append(s)
            live = still
        return drafts

    def _forward(self, seqs: list[Seq], past: dict[int, int], feed: dict[int, list[int]]) -> torch.Tensor:
        batch = Batch.build(
            self.cache,
            [[p.page_id for p in seq.pages] for seq in seqs],
            [past[seq.serial] for seq in seqs],
            [len(feed[seq.serial]) for seq in seqs],
        )
        ids = torch.tensor([t for seq in seqs for t in feed[seq.serial]], dtype=torch.long, device=self.cache.device)
        return self.model(ids, batch.positions(), replace(batch, token_ids=ids))


def make_drafter(
    cache: Cache,
    vocab_size: int,
    max_chunk_size: int,
    draft_model=None,
    draft_cache: Cache | None = None,
    num_draft_tokens: int = 4,
    use_ngram_draft: bool = False,
    max_ngram: int = 4,
    max_q_size: int = 8,
) -> Drafter | None:
    """The drafter the generator's arguments ask for (None: no speculation); ValueError on arguments that
    cannot work together, saying which."""
    if (draft_model is None) != (draft_cache is None):
        raise ValueError("draft_model and draft_cache go together: pass both (draft_cache = Cache(draft_model, ...))")
    if draft_model is not None and use_ngram_draft:
        raise ValueError("use_ngram_draft=True and a draft_model were both given; choose one way of drafting")
    if draft_cache is not None:
        if draft_cache.model is not draft_model:
            raise ValueError("draft_cache was made for a different model; create it with Cache(draft_model, ...)")
        if draft_cache.page_size != cache.page_size or draft_cache.num_pages < cache.num_pages:
            raise ValueError(
                f"draft_cache must use the cache's page layout: page_size {cache.page_size} (got "
                f"{draft_cache.page_size}) and at least {cache.num_pages} pages (got {draft_cache.num_pages}); "
                "make it with the same max_seq_len and page_size"
            )
    if draft_cache is not None and draft_cache.window_layers:
        raise ValueError(
            "draft_cache keeps its sliding-window layers in window slots, but a draft reads the main cache's page "
            "ids: make it with sliding_tokens=max_seq_len"
        )
    if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be a positive int, got {num_draft_tokens!r}")
    if not isinstance(max_ngram, int) or max_ngram < 1:
        raise ValueError(f"max_ngram must be a positive int, got {max_ngram!r}")
    if not isinstance(max_q_size, int) or max_q_size < 1:
        raise ValueError(f"max_q_size must be a positive int, got {max_q_size!r}")
    if use_ngram_draft:
        return NgramDrafter(num_draft_tokens, max_q_size, vocab_size, max_ngram)
    if draft_model is not None:
        return ModelDrafter(num_draft_tokens, max_q_size, vocab_size, draft_model, draft_cache, max_chunk_size)
    return None


def ngram_draft(tokens: Sequence[int], max_ngram: int, num_tokens: int, vocab_size: int) -> list[int]:
    """Up to `num_tokens` ids that followed the most recent earlier occurrence of the context's longest suffix.

    Suffixes of max_ngram tokens down to 1 are tried; ids outside the vocabulary (image runs) end a draft,
    since the main model could not be fed them as plain tokens.
    """
    n_tokens = len(tokens)
    for n in range(min(max_ngram, n_tokens - 1), 0, -1):
        suffix = list(tokens[n_tokens - n :])
        for start in range(n_tokens - n - 1, -1, -1):
            if tokens[start + n - 1] != suffix[-1] or list(tokens[start : start + n]) != suffix:
                continue
            draft = []
            for t in tokens[start + n : start + n + num_tokens]:
                if not 0 <= t < vocab_size:
                    break
                draft.append(t)
            if draft:
                return draft
    return []


def verify_sampled(
    logits_row: torch.Tensor,
    settings: SamplerSettings,
    state: SamplerState,
    blocked: set[int] | None,
    draft_id: int,
) -> tuple[tuple[int, float, None], bool]:
    """Accept or replace one drafted token of a sampled job -> ((token id, its probability, None), accepted).

    The probability returned is the token's in the job's final distribution, as sample() reports it.
    """
    ids, probs = distribution(logits_row, settings, state, blocked)  # [W], [W] float64, sums to 1
    hit = ids == draft_id
    p_draft = float(probs[hit].sum())
    u = float(torch.rand(1, generator=state.generator, dtype=torch.float64))
    if u < p_draft:
        return (draft_id, p_draft, None), True
    rest = probs.masked_fill(hit, 0.0)
    point = torch.rand(1, 1, generator=state.generator, dtype=torch.float64).to(rest.device)
    col = int(steps.draw(rest[None], point)[0])
    return (int(ids[col]), float(probs[col]), None), False


def merge_results(results: list[Result]) -> Result:
    """One streaming result for several tokens of one job emitted in the same iterate()."""
    if len(results) == 1:
        return results[0]
    merged: Result = dict(results[-1])  # eos, held text and counters come from the last
    for key in ("text", "reasoning", "answer"):  # reasoning and answer only with a job's ReasoningFormat
        if key in results[-1]:
            merged[key] = "".join(r.get(key, "") for r in results)
    for key in _CONCAT_TENSORS:
        parts = [r[key] for r in results if key in r]
        if parts:
            merged[key] = torch.cat(parts, dim=1)
    return merged


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
