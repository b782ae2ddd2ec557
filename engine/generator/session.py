"""One job's life inside the generator: sampler state, text and stop handling, result dictionaries."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from engine.generator.filters import JobFilters, unpack_bitmask
from engine.generator.job import DynamicJob
from engine.generator.results import Result
from engine.generator.sampler import SampleOutput, SamplerState, sample, tokenize_breakers
from engine.generator.scheduler import Seq
from engine.generator.text import TextTracker


class JobSession:
    """Runtime state of an enqueued job; the scheduler's `Seq` holds its pages and token positions."""

    def __init__(self, job: DynamicJob, tokenizer):
        self.job = job
        self.tokenizer = tokenizer
        self.prompt_ids = list(job.prompt_ids)
        self.heal_text: str | None = None
        if job.token_healing and len(self.prompt_ids) > 1 and 0 <= self.prompt_ids[-1] < tokenizer.vocab_size:
            # Regenerate the prompt's last token: the model may prefer a longer token starting with its text.
            self.heal_text = tokenizer.token_texts()[self.prompt_ids.pop()]
        self.seq: Seq | None = None
        self.generated: list[int] = []
        self.probs: list[float] = []
        self.top: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.logits: list[torch.Tensor] = []
        self.released = 0  # generated tokens handed out in results
        self.blocked_at: dict[int, set[int]] = {}  # generated index -> tokens a banned string ruled out there
        self.text = TextTracker(job.stop_strings, job.banned_strings)
        # Built at enqueue so a filter that cannot run with this tokenizer fails there, not mid-iterate.
        self.filters = JobFilters(job.filters, tokenizer) if job.filters else None
        self.detok = None
        self.state: SamplerState | None = None
        self.time_admitted = self.time_first_token = None
        self.speculative = False  # set by a generator that drafts tokens; eos results then count them
        self.num_accepted_draft = self.num_rejected_draft = 0
        self.reasoning = None  # a ReasoningParser over the emitted text, for a job given a ReasoningFormat
        self.full_reasoning = self.full_answer = ""

    # --- lifecycle -----------------------------------------------------------------------------------------

    def start(self, now: float, vocab_size: int) -> None:
        from engine.tokenizer.detokenizer import StreamingDetokenizer

        self.time_admitted = now
        self.vocab_size = vocab_size
        settings = self.job.gen_settings
        try:
            breaker_ids = tokenize_breakers(settings.dry_sequence_breakers, self.tokenizer)
        except Exception as e:
            raise ValueError(
                f"the tokenizer could not encode dry_sequence_breakers {settings.dry_sequence_breakers!r} "
                f"({type(e).__name__}: {e}); pass other breaker strings"
            ) from e
        self.state = SamplerState(
            settings,
            self.prompt_ids,
            seed=self.job.seed,
            dry_breaker_ids=breaker_ids,
            prompt_penalties=self.job.prompt_penalties,
        )
        self.detok = StreamingDetokenizer(self.tokenizer, decode_special_tokens=self.job.decode_special_tokens)
        self._heal_pending = self.heal_text is not None
        if self.job.reasoning is not None:  # the prompt's end says whether its template opened the block
            tail = self.tokenizer.decode(self.prompt_ids[-16:], decode_special_tokens=True)
            self.reasoning = self.job.reasoning.parser(tail)
        if self.heal_text is not None:
            texts = self.tokenizer.token_texts()
            allowed = {i for i in range(min(vocab_size, len(texts))) if texts[i].startswith(self.heal_text)}
            self.heal_blocked = set(range(vocab_size)) - allowed

    def base(self, stage: str, eos: bool = False) -> Result:
        r: Result = {"job": self.job, "serial": self.job.serial, "stage": stage, "eos": eos}
        if self.job.identifier is not None:
            r["identifier"] = self.job.identifier
        return r

    def prefill_result(self) -> Result:
        r = self.base("prefill")
        r["curr_progress"] = self.seq.num_computed
        r["max_progress"] = self.seq.prompt_len
        return r

    # --- sampling ------------------------------------------------------------------------------------------

    def blocked(self) -> set[int] | None:
        n = len(self.generated)
        out: set[int] = set()
        if n < self.job.min_new_tokens:
            out |= self.job.stop_tokens
        out |= self.blocked_at.get(n, set())
        if n == 0 and self.heal_text is not None:
            out |= self.heal_blocked
        return out or None

    def end_token_ids(self) -> list[int]:
        """Tokens that end a filtered job: the tokenizer's end-of-sequence ids and the job's stop tokens."""
        return sorted(set(self.tokenizer.eos_token_ids) | self.job.stop_tokens)

    @staticmethod
    def filter_masks(sessions: Sequence[JobSession], width: int, device: torch.device) -> torch.Tensor:
        """Allowed next tokens of filtered sessions, bool [len(sessions), width] on `device`.

        End tokens are allowed only where every filter has a complete match and min_new_tokens is reached;
        with filter_prefer_eos they are then the only tokens allowed.
        """
        words = torch.stack([s.filters.mask_words() for s in sessions]).to(device)  # [rows, num_words]
        allowed = unpack_bitmask(words, sessions[0].filters.vocab_size, width)  # [rows, width]
        for row, s in enumerate(sessions):
            end_ids = [t for t in s.end_token_ids() if t < width]
            may_end = s.filters.can_end() and len(s.generated) >= s.job.min_new_tokens
            if may_end and s.job.filter_prefer_eos and end_ids:
                allowed[row] = False
            allowed[row, end_ids] = may_end
        return allowed

    @staticmethod
    def sample_many(sessions: Sequence[JobSession], logits: torch.Tensor) -> list[tuple]:
        """Sample every session's next token from its logits row -> per session (id, prob, top)."""
        rows = [i for i, s in enumerate(sessions) if s.filters is not None]
        if rows:
            # Rejected tokens become -inf before any sampler step, as a banned token would.
            allowed = JobSession.filter_masks([sessions[i] for i in rows], logits.shape[-1], logits.device)
            index = torch.tensor(rows, device=logits.device)
            logits = logits.index_put((index,), logits[index].masked_fill(~allowed, -torch.inf))
        k = max(s.job.return_top_tokens for s in sessions)
        out: SampleOutput = sample(
            logits,
            [s.job.gen_settings for s in sessions],
            [s.state for s in sessions],
            [s.blocked() for s in sessions],
            return_top_k=k,
        )
        ids = out.token_ids.tolist()  # the one designed sync of a step
        probs = out.token_probs.tolist()
        return [
            (ids[i], probs[i], None if out.top_ids is None else (out.top_ids[i], out.top_probs[i]))
            for i in range(len(sessions))
        ]

    def accept(self, sampled: tuple, logits_row: torch.Tensor, now: float) -> tuple[Result | None, int | None]:
        """Take a sampled token; returns (result to emit or None, generated index to rewind to or None)."""
        token, prob, top = sampled
        job = self.job
        if self.time_first_token is None:
            self.time_first_token = now
        idx = len(self.generated)
        self.generated.append(token)
        self.state.append(token)
        self.probs.append(prob)
        if job.return_top_tokens:
            self.top.append((top[0][: job.return_top_tokens], top[1][: job.return_top_tokens]))
        if job.return_logits:
            self.logits.append(logits_row.clone())

        if token in job.stop_tokens:
            emitted = self.text.flush()
            r = self._streaming(emitted, upto=len(self.generated))
            return self._eos(r, "stop_token", token=token), None
        filter_done = self.filters.feed(token) if self.filters is not None else False
        chunk = self.detok.add(token)
        if self._heal_pending:
            if chunk.startswith(self.heal_text):
                chunk = chunk[len(self.heal_text) :]
                self._heal_pending = False
        update = self.text.add(idx, chunk)
        if update.banned is not None:
            return self._undo(*update.banned), update.banned[0]
        if update.stop_string is not None:
            r = self._streaming(update.emitted, upto=idx + 1)
            return self._eos(r, "stop_string", string=update.stop_string), None
        if len(self.generated) >= job.max_new_tokens or filter_done:
            # A character left incomplete at the end is flushed through the tracker, so the streamed text
            # and full_completion stay the same string.
            self.text.held += self.detok.flush()
            emitted = update.emitted + self.text.flush()
            r = self._streaming(emitted, upto=len(self.generated))
            reason = "max_new_tokens" if len(self.generated) >= job.max_new_tokens else "end_filter"
            return self._eos(r, reason), None
        upto = self.text.held_tokens[0][0] if self.text.held_tokens else len(self.generated)
        return self._streaming(update.emitted, upto=upto), None

    def _undo(self, token_idx: int, banned: str) -> Result:
        """A banned string began at generated token `token_idx`: drop it and what followed, block that token."""
        suppressed = self.generated[token_idx:]
        self.blocked_at.setdefault(token_idx, set()).add(suppressed[0])
        del self.generated[token_idx:], self.probs[token_idx:], self.top[token_idx:], self.logits[token_idx:]
        if self.filters is not None:
            self.filters.rollback(len(suppressed))
        self.state.truncate(len(self.prompt_ids) + token_idx)
        self.text.rewind(token_idx)
        # Rebuild the detokenizer's partial-character state from the kept tokens.
        from engine.tokenizer.detokenizer import StreamingDetokenizer

        self.detok = StreamingDetokenizer(self.tokenizer, decode_special_tokens=self.job.decode_special_tokens)
        for t in self.generated:
            self.detok.add(t)
        self._heal_pending = self.heal_text is not None and token_idx == 0
        r = self.base("streaming")
        r["text"] = ""
        if self.reasoning is not None:
            r["reasoning"] = r["answer"] = ""
        r["token_ids"] = torch.empty((1, 0), dtype=torch.long)
        r["suppressed_text"] = banned
        r["suppressed_tokens"] = torch.tensor([suppressed], dtype=torch.long)
        return r

    # --- results -------------------------------------------------------------------------------------------

    def _streaming(self, text: str, upto: int) -> Result:
        lo, hi = self.released, max(self.released, upto)
        self.released = hi
        r = self.base("streaming")
        r["text"] = text
        if self.reasoning is not None:
            self._split(r, *self.reasoning.feed(text))
        r["token_ids"] = torch.tensor([self.generated[lo:hi]], dtype=torch.long)
        if self.job.return_probs:
            r["token_probs"] = torch.tensor([self.probs[lo:hi]])
        if self.job.return_top_tokens:
            pairs = self.top[lo:hi]
            k = self.job.return_top_tokens
            r["top_k_tokens"] = (
                torch.stack([p[0] for p in pairs])[None] if pairs else torch.empty(1, 0, k, dtype=torch.long)
            )
            r["top_k_probs"] = torch.stack([p[1] for p in pairs])[None] if pairs else torch.empty(1, 0, k)
        if self.job.return_logits:
            rows = self.logits[lo:hi]
            r["logits"] = torch.stack(rows)[None] if rows else torch.empty(1, 0, self.vocab_size)
        return r

    def _split(self, r: Result, reasoning: str, answer: str) -> None:
        """The result's text as reasoning and answer (a job with a ReasoningFormat); `reasoning` and `answer`
        replace what the result held, and the totals grow by what they add."""
        self.full_reasoning += reasoning[len(r.get("reasoning", "")) :]
        self.full_answer += answer[len(r.get("answer", "")) :]
        r["reasoning"], r["answer"] = reasoning, answer

    def _eos(self, r: Result, reason: str, token: int | None = None, string: str | None = None) -> Result:
        end = self.time_first_token if self.time_first_token is not None else self.time_admitted
        now = time.perf_counter()
        r["eos"] = True
        r["eos_reason"] = reason
        if token is not None:
            r["eos_triggering_token_id"] = token
            r["eos_triggering_token_str"] = self.tokenizer.decode([token], decode_special_tokens=True)
        if string is not None:
            r["eos_triggering_string"] = string
        r["full_completion"] = self.text.text
        if self.reasoning is not None:  # what a partial tag held back at the end
            reasoning, answer = self.reasoning.finish()
            self._split(r, r["reasoning"] + reasoning, r["answer"] + answer)
            r["full_reasoning"], r["full_answer"] = self.full_reasoning.strip(), self.full_answer
        r["new_tokens"] = len(self.generated)
        r["prompt_tokens"] = len(self.job.prompt_ids)
        r["cached_tokens"] = self.seq.cached_tokens
        r["cached_pages"] = self.seq.cached_pages
        r["time_enqueued"] = self.time_admitted - self.job.time_enqueued
        r["time_prefill"] = end - self.time_admitted
        r["time_generate"] = now - end
        if self.speculative:
            r["accepted_draft_tokens"] = self.num_accepted_draft
            r["rejected_draft_tokens"] = self.num_rejected_draft
        r["held"] = {
            "text": self.text.held,
            "token_ids": torch.tensor([self.generated[self.released :]], dtype=torch.long),
        }
        return r
