"""DynamicGenerator: continuous batching of jobs over one paged KV cache.

Each iterate():  admit waiting jobs (prefix match, page copies)  ->  one forward pass holding every job's
prefill chunk or decode token (and its drafted tokens, see speculative.py)  ->  sample where logits were
produced  ->  text, stop and banned checks  ->  result dicts.  The scheduler decides with ids only; this file
is where tensors meet the schedule.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

import torch

from engine.cache.cache import Cache
from engine.cache.manager import CacheManager
from engine.cache.page_table import PageTable
from engine.cache.recurrent import StateSlots
from engine.cache.window import WindowSlots
from engine.generator import convenience, guidance
from engine.generator.checks import check_job
from engine.generator.filters import Filter, MaskWorkers
from engine.generator.images import longest_image_run, splice_inputs
from engine.generator.job import DynamicJob
from engine.generator.results import Result
from engine.generator.sampler_settings import SamplerSettings
from engine.generator.scheduler import Scheduler, Seq, Step
from engine.generator.session import JobSession
from engine.generator.speculative import Drafter, make_drafter
from engine.models.batch import Batch
from engine.threads import shared_policy

log = logging.getLogger(__name__)


class JobFailure(RuntimeError):
    """Raised by iterate() when jobs failed; they have been removed, and the others go on next iterate()."""

    def __init__(self, failures: list[tuple[DynamicJob, BaseException]]):
        self.failures = failures
        names = ", ".join(f"{job!r}: {type(e).__name__}: {e}" for job, e in failures)
        super().__init__(f"{len(failures)} job(s) failed and were removed: {names}")


class DynamicGenerator:
    """Runs many jobs at once over a shared paged cache (the seed documents' dynamic generator)."""

    def __init__(
        self,
        model,
        cache: Cache,
        tokenizer,
        max_batch_size: int | None = None,
        max_seq_len: int | None = None,
        max_chunk_size: int | None = None,
        max_q_size: int = 8,
        draft_model=None,
        draft_cache=None,
        num_draft_tokens: int = 4,
        use_ngram_draft: bool = False,
        max_ngram: int = 4,
        max_sampling_threads: int = 16,
        min_sampling_threads: int = 3,
        paged: bool = True,
        filter_background_eval: bool = True,
        adapt_threads: bool = True,
    ):
        if cache.model is not model:
            raise ValueError("the cache was made for a different model; create it with Cache(model, ...)")
        self.max_chunk_size = max_chunk_size or 2048
        # Speculative decoding (None: one token per decode step); checks its arguments first.
        self.drafter: Drafter | None = make_drafter(
            cache,
            model.config.vocab_size,
            self.max_chunk_size,
            draft_model=draft_model,
            draft_cache=draft_cache,
            num_draft_tokens=num_draft_tokens,
            use_ngram_draft=use_ngram_draft,
            max_ngram=max_ngram,
            max_q_size=max_q_size,
        )
        state = getattr(cache, "state", None)
        if getattr(draft_cache, "state", None) is not None:
            # The draft model's cache would need its own snapshots and rewinds (the main model's are kept).
            raise ValueError(
                "a draft model with linear-attention layers (Qwen3.5) is not supported; draft with a model of "
                "attention layers only, or use use_ngram_draft=True"
            )
        self.model = model
        self.cache = cache
        self.tokenizer = tokenizer
        # fewer threads while other programs keep cores busy (engine/threads.py); CPU models only
        self.threads = shared_policy() if adapt_threads and cache.device.type == "cpu" else None
        self.max_seq_len = max_seq_len or cache.max_seq_len
        self.max_sampling_threads = max_sampling_threads
        self.min_sampling_threads = min_sampling_threads
        self.filter_background_eval = filter_background_eval
        self._mask_workers = MaskWorkers(max_sampling_threads, min_sampling_threads) if filter_background_eval else None
        self.page_size = cache.page_size
        self.num_pages = cache.num_pages
        if not paged:
            max_batch_size = 1  # one contiguous sequence
        # Every running job holds at least one page, so the cache bounds how many can run at once.
        self.max_batch_size = max_batch_size or min(self.num_pages, 256)
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        window = None
        if cache.window_layers:  # sliding-window layers in slots of their own (engine/cache/window.py)
            drafted = 1 + (num_draft_tokens if self.drafter is not None else 0)
            window = WindowSlots(cache.num_slots, cache.window, self.page_size, decode_tokens=drafted)
        # a hybrid model's recurrent-state slots (engine/cache/recurrent.py)
        states = StateSlots(state.num_slots, state.num_live, state.bytes_per_slot) if state is not None else None
        self.cache_manager = CacheManager(
            self.num_pages,
            self.page_size,
            disk=cache.disk,
            window=window,
            states=states,
            speculative=self.drafter is not None,
        )
        if self.drafter is not None:
            self.drafter.room = self.cache_manager.draft_room
        self.scheduler = Scheduler(self.cache_manager, self.max_batch_size, self.max_chunk_size)
        self._sessions: dict[int, JobSession] = {}  # serial -> running or waiting job
        self._buffered: list[Result] = []  # results produced while generate() ran others' steps
        self._next_serial = 0
        self._lock = threading.RLock()

    # --- queue -------------------------------------------------------------------------------------------

    def enqueue(self, job: DynamicJob | Sequence[DynamicJob]) -> int | list[int]:
        """Queue one job (returns its serial) or a list of jobs (returns their serials)."""
        if isinstance(job, (list, tuple)):
            return [self.enqueue(j) for j in job]
        if not isinstance(job, DynamicJob):
            raise TypeError(f"enqueue takes a DynamicJob or a list of them, not {type(job).__name__}")
        guidance.strip_left_padding(job, self.tokenizer)
        self.validate(job)
        with self._lock:
            job.serial = self._next_serial
            job.generator = self
            self._next_serial += 1
            session = JobSession(job, self.tokenizer)
            session.speculative = self.speculative
            seq = Seq(
                serial=job.serial,
                tokens=list(session.prompt_ids),
                prompt_len=len(session.prompt_ids),
                max_new_tokens=job.max_new_tokens,
                max_skips=job.max_skips,
                may_rewind=bool(job.banned_strings),
                priority=job.priority,
                max_step=self.max_chunk_size + longest_image_run(session.prompt_ids),
            )
            if job.negative_ids is not None:
                neg = job.negative_ids
                seq.negative = replace(
                    seq, tokens=list(neg), prompt_len=len(neg), pages=[], slots_held=set(), shadow=True
                )
            session.seq = seq
            self._sessions[job.serial] = session
            self.scheduler.waiting.append(seq)
        return job.serial

    def validate(self, job: DynamicJob) -> None:
        """Raise ValueError if the job can never run on this generator (checked again by enqueue)."""
        if job.generator is not None:
            where = "this generator" if job.generator is self else "another generator"
            raise ValueError(f"{job!r} is already enqueued on {where}; create a new DynamicJob to run it again")
        check_job(job, self.model, self.cache_manager, self.max_batch_size, self.max_seq_len)

    def cancel(self, job: DynamicJob) -> bool:
        """Stop a job at any stage and free its pages. Returns False if it was not queued or running here
        (never enqueued, already ended, or a job of another generator, which is left alone)."""
        with self._lock:
            session = self._sessions.get(job.serial) if job.serial is not None else None
            if session is None or session.job is not job:
                return False  # serials are per generator: another generator's job may share this one's serial
            del self._sessions[job.serial]
            job.generator = None
            self.scheduler.finish(session.seq)
            if self.drafter is not None:
                self.drafter.forget(job.serial)
            return True

    def clear_queue(self) -> None:
        """Cancel every job, waiting or running."""
        with self._lock:
            for session in list(self._sessions.values()):
                self.cancel(session.job)
            self._buffered.clear()

    @property
    def page_table(self) -> PageTable:
        """Which cache page holds what (read-only: the cache manager owns it)."""
        return self.cache_manager.table

    @property
    def speculative(self) -> bool:
        """True when decode steps draft tokens (n-gram or draft model) and verify them in one forward."""
        return self.drafter is not None

    def num_remaining_jobs(self) -> int:
        """Jobs queued or running, and ended jobs whose last results wait for the next iterate() (kept there
        when an iterate() raised JobFailure or generate() ran their steps), so `while num_remaining_jobs()`
        loses no result."""
        held = {r["serial"] for r in self._buffered} - self._sessions.keys()
        return len(self._sessions) + len(held)

    def num_active_jobs(self) -> int:
        return sum(1 for seq in self.scheduler.active if not seq.shadow)

    # --- one step ------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def iterate(self) -> list[Result]:
        """Advance every job by one step; returns one result dict per job with activity.

        admit waiting jobs -> one forward over every job's chunk (and drafts) -> sample -> emit results.
        """
        with self._lock:
            if self.threads is not None:
                self.threads.update()
            results, self._buffered = self._buffered, []
            failures: list[tuple[DynamicJob, BaseException]] = []
            self._save_named_pages()  # pages named by a cancel since the last step, before admission reuses them
            results += self._admit(failures)
            steps = self.scheduler.plan()
            if steps:
                drafts, logits = self._forward_or_fail(steps, results, failures)
                results += self._sample_and_emit(steps, logits, drafts, failures)
                self._save_named_pages()
            if failures:
                self._fail(results, failures)
            return results

    def _admit(self, failures: list[tuple[DynamicJob, BaseException]]) -> list[Result]:
        """Admit waiting jobs the cache can hold (copying partly matched prefix pages); their "started" results."""
        admitted, copies = self.scheduler.admit()
        for c in copies:
            self.cache.copy_page(c.src, c.dst, c.num_tokens, c.src_slot, c.dst_slot)
        self.cache_manager.copies_done()
        self._copy_states()
        self._load_pages()
        now = time.perf_counter()
        results = []
        for seq in admitted:
            session = self._sessions[seq.serial]
            try:
                session.start(now, self.model.config.vocab_size)
            except Exception as e:  # this job's settings cannot start: it fails alone, its batch goes on
                failures.append((session.job, e))
                self.cancel(session.job)
                continue
            results.append(session.base("started"))
        return results

    def _load_pages(self) -> None:
        """Fill the pages admission found on disk; a page without a valid copy is computed by its sequence."""
        loads = self.cache_manager.take_loads()
        if not loads:
            return
        failed = {
            d.page_id for d in loads if not self.cache.load_page(d.page_id, d.hash, d.prev_hash, d.token_ids, d.slot)
        }
        for seq in self.cache_manager.loads_done(failed):
            seq.cached_tokens = seq.num_computed
            seq.cached_pages = self.cache_manager.pages_for(seq.num_computed)

    def _copy_states(self) -> None:
        """Run the recurrent-state copies the cache manager asked for (snapshots kept and restored), in order."""
        for c in self.cache_manager.take_state_copies():
            self.cache.state.copy_slot(c.src, c.dst)

    def _save_named_pages(self) -> None:
        # Snapshots the rows now (the page may be reused next step); the disk tier writes them off this thread.
        for d in self.cache_manager.take_named():
            self.cache.save_page(d.page_id, d.hash, d.prev_hash, d.token_ids, d.slot)

    def _forward_or_fail(
        self, steps: list[Step], results: list[Result], failures: list[tuple[DynamicJob, BaseException]]
    ) -> tuple[dict[int, list[int]], torch.Tensor]:
        """Drafts and the forward pass; if either raises, every job in the step fails (JobFailure)."""
        self._start_filter_masks(steps)
        try:
            drafts = self.drafter.propose([(self._sessions[s.seq.serial], s) for s in steps]) if self.drafter else {}
            return drafts, self._forward(steps, drafts)
        except Exception as e:
            failures += [(self._sessions[s.seq.serial].job, e) for s in steps if not s.seq.shadow]
            for s in steps:
                if s.seq.serial in self._sessions:  # a CFG pair's two steps share one session
                    self.cancel(self._sessions[s.seq.serial].job)
            self._fail(results, failures, e)

    def _fail(
        self, results: list[Result], failures: list[tuple[DynamicJob, BaseException]], cause: Exception | None = None
    ) -> NoReturn:
        """Raise JobFailure for removed jobs; the other jobs' results of this step wait for the next iterate()."""
        failed = {job.serial for job, _ in failures}
        self._buffered = [r for r in results if r["serial"] not in failed]
        error = JobFailure(failures)
        error.__cause__ = cause
        raise error

    def _forward(self, steps: list[Step], drafts: dict[int, list[int]]) -> torch.Tensor:
        # A speculating step feeds its newest token and its drafted tokens; every one of them gets logits.
        # Drafted K/V rows land past num_computed, in pages not yet full, so they are never named or shared
        # before verification, and rejected ones are overwritten by later steps.
        fed = [s.token_ids + drafts.get(s.seq.serial, []) for s in steps]
        manager = self.cache_manager
        for s, f in zip(steps, fed):
            manager.step(s.seq, s.start, s.start + len(f))
        self._copy_states()  # restores before this forward; a drafting sequence's state before its drafts
        batch = Batch.build(
            self.cache,
            [[p.page_id for p in s.seq.pages] for s in steps],
            [s.start for s in steps],
            [len(f) for f in fed],
            logits=[list(range(len(s.token_ids) - 1, len(f))) if s.needs_logits else [] for s, f in zip(steps, fed)],
            window_tables=[manager.window_table(s.seq) for s in steps] if manager.window is not None else None,
            state_slots=[s.seq.state_slot for s in steps] if manager.states is not None else None,
        )
        ids = torch.tensor([t for f in fed for t in f], dtype=torch.long, device=self.cache.device)
        runs, start = [], 0
        for s in steps:
            embeddings = self._sessions[s.seq.serial].job.embeddings
            if embeddings:
                runs.append((start, len(s.token_ids), embeddings))
            start += len(s.token_ids)
        inputs = splice_inputs(self.model, ids, runs) if runs else ids
        positions = batch.positions()
        mrope_positions = getattr(self.model, "mrope_positions", None)
        if runs and mrope_positions is not None:
            # M-RoPE (Qwen2-VL): a token's position depends on every image before it, which this chunk may not
            # hold, so the model computes [3, n] positions from each sequence's whole token list and its images.
            rows = [
                mrope_positions(s.seq.tokens, s.start, len(s.token_ids), self._sessions[s.seq.serial].job.embeddings)
                for s in steps
            ]
            positions = torch.cat(rows, dim=1).to(positions.device)
        return self.model(inputs, positions, replace(batch, token_ids=ids))

    def _start_filter_masks(self, steps: list[Step]) -> None:
        # A filter mask depends only on tokens already accepted, so it is computed while the forward runs.
        if self._mask_workers is not None:
            sessions = [self._sessions[s.seq.serial] for s in steps if s.needs_logits and not s.seq.shadow]
            self._mask_workers.start([s.filters for s in sessions if s.filters is not None])

    def _sample_and_emit(
        self,
        steps: list[Step],
        logits: torch.Tensor,
        drafts: dict[int, list[int]],
        failures: list[tuple[DynamicJob, BaseException]],
    ) -> list[Result]:
        """Record the forward's K/V, then sample where it produced logits: prefill progress, tokens, eos."""
        results: list[Result] = []
        for step in steps:
            self.scheduler.commit(step)
            if not step.needs_logits and not step.seq.shadow:
                session = self._sessions[step.seq.serial]
                if not session.generated:  # (not the rows a hybrid model computes again after a rewind)
                    results.append(session.prefill_result())
        steps = [s for s in steps if s.needs_logits]
        if not steps:
            return results
        if any(s.seq.shadow for s in steps):
            scales = {s.seq.serial: self._sessions[s.seq.serial].job.cfg_scale for s in steps if s.seq.shadow}
            steps, logits = guidance.mix_pairs(steps, logits, {k: len(d) + 1 for k, d in drafts.items()}, scales)
        plain, plain_rows, row = [], [], 0
        now = time.perf_counter()
        for step in steps:
            draft = drafts.get(step.seq.serial)
            if draft is None:
                plain.append(step)
                plain_rows.append(row)
                row += 1
                continue
            session = self._sessions[step.seq.serial]
            try:
                rows = logits[row : row + len(draft) + 1]
                result = self.drafter.verify(session, step, rows, draft, self.scheduler, now)
            except Exception as e:
                failures.append((session.job, e))
                self.cancel(session.job)
                result = None
            if result is not None:
                results.append(result)
                if result["eos"]:
                    self._end(session)
            row += len(draft) + 1
        if len(plain_rows) != logits.shape[0]:
            logits = logits[plain_rows]
        return results + self._sample_plain(plain, logits, failures)

    def _sample_plain(
        self, steps: list[Step], logits: torch.Tensor, failures: list[tuple[DynamicJob, BaseException]]
    ) -> list[Result]:
        if not steps:
            return []
        sessions = [self._sessions[s.seq.serial] for s in steps]
        try:
            outputs = JobSession.sample_many(sessions, logits)
        except Exception:
            # One job's settings or state broke the batched call: sample one by one to find it.
            outputs = []
            for i, session in enumerate(sessions):
                try:
                    outputs.append(JobSession.sample_many([session], logits[i : i + 1])[0])
                except Exception as e:
                    outputs.append(e)
        results: list[Result] = []
        now = time.perf_counter()
        for session, row, out in zip(sessions, logits, outputs):
            if isinstance(out, BaseException):
                failures.append((session.job, out))
                self.cancel(session.job)
                continue
            try:
                result, rewind_to = session.accept(out, row, now)
            except Exception as e:
                failures.append((session.job, e))
                self.cancel(session.job)
                continue
            if rewind_to is not None:
                self.scheduler.rewind(session.seq, rewind_to)
            else:
                self.scheduler.append(session.seq, session.generated[-1])
            if result is not None:
                results.append(result)
                if result["eos"]:
                    self._end(session)
        return results

    def _end(self, session: JobSession) -> None:
        self._sessions.pop(session.job.serial, None)
        session.job.generator = None
        if self.drafter is not None:
            self.drafter.forget(session.job.serial)
        self.scheduler.finish(session.seq)

    # --- convenience ---------------------------------------------------------------------------------------

    def keep_results(self, results: list[Result]) -> None:
        """Hand back other jobs' results read while waiting; the next iterate() returns them first."""
        with self._lock:
            self._buffered = list(results) + self._buffered

    def generate(
        self,
        prompt: str | Sequence[str],
        max_new_tokens: int,
        min_new_tokens: int = 0,
        seed: int | None = None,
        gen_settings: SamplerSettings | Sequence[SamplerSettings] | None = None,
        token_healing: bool = False,
        encode_special_tokens: bool = False,
        decode_special_tokens: bool = False,
        stop_conditions: Sequence[int | str] | None = None,
        add_bos: bool = False,
        abort_event: threading.Event | None = None,
        completion_only: bool = False,
        embeddings: Sequence[Any] | None = None,
        banned_strings: Sequence[str] | None = None,
        return_last_results: bool = False,
        filters: Sequence[Filter] | None = None,
        filter_prefer_eos: bool = False,
    ) -> convenience.GenerateOutput:
        """Complete one prompt (returns a string) or a list (returns a list), waiting only for these jobs.

        Other jobs keep running and keep their results for the next iterate(); see convenience.generate.
        """
        return convenience.generate(
            self,
            prompt,
            max_new_tokens,
            min_new_tokens=min_new_tokens,
            seed=seed,
            gen_settings=gen_settings,
            token_healing=token_healing,
            encode_special_tokens=encode_special_tokens,
            decode_special_tokens=decode_special_tokens,
            stop_conditions=stop_conditions,
            add_bos=add_bos,
            abort_event=abort_event,
            completion_only=completion_only,
            embeddings=embeddings,
            banned_strings=banned_strings,
            return_last_results=return_last_results,
            filters=filters,
            filter_prefer_eos=filter_prefer_eos,
        )
