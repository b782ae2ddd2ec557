"""Constrained output: job filters that hold sampling to a JSON schema, a regex or a list of choices.

A filter object only describes the language (it is checked when made and can serve many jobs); each job
gets a `FilterMatcher` per filter that follows the tokens it accepts and says which tokens may come next.
Grammars are compiled and matched by llguidance (MIT, a Rust Earley parser with lazily computed token
masks, no torch/CUDA dependency; a token mask is cheap enough to compute beside every forward).

Per sampled token of a filtered job::

    before the forward:  JobFilters.start_mask(pool)   masks computed on worker threads (GIL released)
    before sampling:     filter_masks(...)              bool [rows, vocab]; rejected tokens -> -inf
    after sampling:      JobFilters.feed(token)         True when the grammar is complete -> "end_filter"
    banned-string undo:  JobFilters.rollback(n)
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = [
    "ChoiceFilter",
    "Filter",
    "FilterMatcher",
    "JSONFilter",
    "JobFilters",
    "MaskWorkers",
    "RegexFilter",
    "unpack_bitmask",
]


def _llg():
    # Imported on first use: the engine loads without paying for it when no job is filtered.
    import llguidance

    return llguidance


class Filter:
    """A constraint on a job's output, as an llguidance grammar; subclasses build and check the grammar.

    Filters hold no per-job state: pass the same filter to any number of jobs (`DynamicJob(filters=[...])`).
    """

    def __init__(self, grammar: str, what: str):
        error = _llg().LLMatcher.validate_grammar(grammar)
        if error and not error.startswith("WARNING"):
            raise ValueError(f"{what} is not valid: {error.strip()}")
        self.grammar = grammar
        self._what = what

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._what}>"


class JSONFilter(Filter):
    """Output is one JSON value matching `schema` (a dict, a JSON string, or a pydantic model class).

    Whitespace between tokens is left out unless `whitespace_flexible`: sampled models otherwise tend to run
    on with spaces and newlines and never close the value.
    """

    def __init__(self, schema: Mapping[str, Any] | str | Any, whitespace_flexible: bool = False):
        if hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"JSONFilter: the schema string is not JSON ({e})") from e
        if not isinstance(schema, Mapping):
            raise ValueError(
                f"JSONFilter needs a JSON schema (a dict, a JSON string or a pydantic model), got {type(schema).__name__}"
            )
        try:
            grammar = _llg().LLMatcher.grammar_from_json_schema(
                dict(schema), overrides={"whitespace_flexible": bool(whitespace_flexible)}
            )
        except (ValueError, TypeError) as e:
            raise ValueError(f"JSONFilter: the schema cannot be read: {e}") from e
        self.schema = dict(schema)
        super().__init__(grammar, f"JSON schema {_short(json.dumps(self.schema))}")


class RegexFilter(Filter):
    """Output matches `pattern` as a whole (Rust regex syntax: no look-around or back-references)."""

    def __init__(self, pattern: str):
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"RegexFilter needs a non-empty pattern string, got {pattern!r}")
        self.pattern = pattern
        super().__init__(_llg().LLMatcher.grammar_from_regex(pattern), f"regex {_short(pattern)!r}")


class ChoiceFilter(Filter):
    """Output is exactly one of `choices` (non-empty strings)."""

    def __init__(self, choices: Iterable[str]):
        if isinstance(choices, str) or not isinstance(choices, Iterable):
            raise ValueError(f"ChoiceFilter needs a list of strings, got {choices!r}")
        choices = list(dict.fromkeys(choices))
        if not choices:
            raise ValueError("ChoiceFilter needs at least one choice; got an empty list")
        bad = [c for c in choices if not isinstance(c, str) or not c]
        if bad:
            raise ValueError(f"ChoiceFilter choices must be non-empty strings, got {bad[:5]!r}")
        self.choices = tuple(choices)
        # JSON string escapes are also Lark literal escapes, so any text (quotes, newlines, emoji) is exact.
        lark = "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
        super().__init__(_llg().LLMatcher.grammar_from_lark(lark), f"choices {_short(repr(self.choices))}")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------- tokenizer


class _TokenizerAdapter:
    """What llguidance's TokenizerWrapper reads: per-token bytes, special ids, eos, and an encoder."""

    def __init__(self, tokenizer, eos_ids: list[int]):
        self.tokens = tokenizer.token_bytes
        self.special_token_ids = sorted(tokenizer.special_token_ids)
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = tokenizer.bos_token_id
        # Weak: the cache below is keyed weakly by the tokenizer, and its value keeps this adapter alive.
        self._tokenizer = weakref.ref(tokenizer)

    def __call__(self, text: bytes | str) -> list[int]:
        tokenizer = self._tokenizer()
        if tokenizer is None:
            raise RuntimeError("the tokenizer behind this filter's grammar matcher was freed")
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return tokenizer.encode_ids(text)


_LL_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LL_LOCK = threading.Lock()


def _ll_tokenizer(tokenizer):
    """llguidance's view of an engine Tokenizer, built once per tokenizer (costly for a large vocabulary)."""
    with _LL_LOCK:
        built = _LL_TOKENIZERS.get(tokenizer)
        if built is None:
            llg = _llg()
            eos_ids = sorted(tokenizer.eos_token_ids)
            if not eos_ids:
                # llguidance needs an end token; the session overrides end-token bits, so any id serves.
                fallback = next((i for i in (tokenizer.pad_token_id, tokenizer.bos_token_id) if i is not None), 0)
                eos_ids = [fallback]
            adapter = _TokenizerAdapter(tokenizer, eos_ids)
            built = llg.LLTokenizer(llg.TokenizerWrapper(adapter), eos_token=eos_ids)
            _LL_TOKENIZERS[tokenizer] = built
        return built


# --------------------------------------------------------------------------------------------- matching


class FilterMatcher:
    """One filter's parse state for one job: `mask_into` / `feed` / `rollback`, `can_end` / `is_complete`."""

    def __init__(self, filter: Filter, tokenizer):
        llg = _llg()
        self.filter = filter
        self.ll_tokenizer = _ll_tokenizer(tokenizer)
        self._matcher = llg.LLMatcher(self.ll_tokenizer, filter.grammar, log_level=0)
        if self._matcher.is_error():
            raise ValueError(f"{filter!r} cannot be used with this tokenizer: {self._matcher.get_error()}")
        self.num_words = (self.ll_tokenizer.vocab_size + 31) // 32

    def begin(self) -> None:
        """Back to the start of the grammar (no tokens accepted)."""
        self._matcher.reset()

    def mask_into(self, words: torch.Tensor) -> None:
        """Write the allowed-next-token bitmask into `words`, a contiguous CPU int32 [num_words] tensor."""
        # The raw-pointer call writes straight into the tensor and releases the GIL while it works.
        self._matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)

    def feed(self, token_id: int) -> None:
        """Accept the sampled token; raises RuntimeError if the grammar rejects it."""
        if not self._matcher.consume_token(int(token_id)):
            raise RuntimeError(f"{self.filter!r} rejected token {token_id}: {self._matcher.get_error()}")

    def rollback(self, num_tokens: int) -> None:
        """Forget the last `num_tokens` accepted tokens."""
        if num_tokens and not self._matcher.rollback(num_tokens):
            raise RuntimeError(f"{self.filter!r} could not roll back {num_tokens} tokens: {self._matcher.get_error()}")

    def can_end(self) -> bool:
        """The output so far is a complete match (it may still go on)."""
        return self._matcher.is_accepting()

    def is_complete(self) -> bool:
        """The output is a complete match and nothing may follow."""
        return self._matcher.is_stopped() and not self._matcher.is_error()


class JobFilters:
    """All filters of one job: the intersection of their masks; complete when any of them is."""

    def __init__(self, filters: Sequence[Filter], tokenizer):
        self.matchers = [FilterMatcher(f, tokenizer) for f in filters]
        self.num_words = self.matchers[0].num_words
        self.vocab_size = self.matchers[0].ll_tokenizer.vocab_size
        self._words: torch.Tensor | None = None  # [num_words] int32 mask for the current state
        self._future: Future | None = None

    def start_mask(self, pool: ThreadPoolExecutor) -> Future:
        """Begin computing the next mask on `pool`; `mask_words()` joins it."""
        self._future = pool.submit(self._compute)
        return self._future

    def mask_words(self) -> torch.Tensor:
        """The allowed-token bitmask [num_words] int32 for the next token (computed now if not started)."""
        if self._future is not None:
            self._future.result()
            self._future = None
        if self._words is None:
            self._compute()
        return self._words

    def _compute(self) -> None:
        words = torch.empty(self.num_words, dtype=torch.int32)  # [num_words]
        self.matchers[0].mask_into(words)
        if len(self.matchers) > 1:
            other = torch.empty_like(words)
            for m in self.matchers[1:]:
                m.mask_into(other)
                words &= other
        self._words = words

    def _settle(self) -> None:
        # The matchers must not change while a worker is reading them.
        if self._future is not None:
            self._future.result()
            self._future = None
        self._words = None

    def feed(self, token_id: int) -> bool:
        """Accept the sampled token in every filter; True when the output is now complete."""
        self._settle()
        for m in self.matchers:
            m.feed(token_id)
        return any(m.is_complete() for m in self.matchers)

    def rollback(self, num_tokens: int) -> None:
        self._settle()
        for m in self.matchers:
            m.rollback(num_tokens)

    def can_end(self) -> bool:
        return all(m.can_end() for m in self.matchers)


def unpack_bitmask(words: torch.Tensor, vocab_size: int, width: int) -> torch.Tensor:
    """int32 bitmasks [rows, num_words] (bit j of word w = token 32w + j) -> bool [rows, width].

    Tokens from `vocab_size` (the tokenizer's) up to `width` (the logits') are never allowed.
    """
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # [rows, num_words, 32]
    allowed = bits.reshape(words.shape[0], -1)[:, : min(vocab_size, width)].bool()
    if allowed.shape[1] < width:
        allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[1]), value=False)
    return allowed


class MaskWorkers:
    """Computes filtered jobs' masks on threads while the forward pass runs (`filter_background_eval`).

    Fewer filtered jobs than `min_threads` share one task; more get a task each, at most `max_threads`
    running at once. Threads start on first use and end with the generator.
    """

    def __init__(self, max_threads: int, min_threads: int):
        self.max_threads = max(1, max_threads)
        self.min_threads = max(1, min_threads)
        self._pool: ThreadPoolExecutor | None = None

    def start(self, job_filters: Sequence[JobFilters]) -> None:
        if not job_filters:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_threads, thread_name_prefix="tandem-filter")
            weakref.finalize(self, self._pool.shutdown, wait=False)
        if len(job_filters) < self.min_threads:
            future = self._pool.submit(lambda: [f._compute() for f in job_filters])
            for f in job_filters:
                f._future = future
        else:
            for f in job_filters:
                f.start_mask(self._pool)
