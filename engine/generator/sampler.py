"""Sampler: per-job settings, per-job state, and one batched ``sample`` call.

Order of steps (each is a no-op for a row that does not use it; the math of each step is in
its docstring in :mod:`engine.generator.sampler_steps`)::

    logits [B, V] float32 (copied; the caller's tensor is never changed)
     1. penalties        repetition (divide positive / multiply negative logits), presence,
                         frequency; over token_repetition_range with token_repetition_decay
     2. bias / bans      token_bias added; disallowed_tokens and this step's `blocked` ids -> -inf
     3. DRY              multiplier * base ** (match_len - allowed_length) off each continuation
        --- greedy rows (top_k == 1 or temperature == 0) stop here: argmax, no sort ---
     4. softmax          p ∝ exp((l - max) / T), or exp(-s (l - max)**2 / T) with smoothing_factor s;
                         T = temperature, or 1 when temperature_last
     5. top_k  6. top_p  7. top_a  8. min_p  9. tfs  10. typical  11. mirostat (truncate)
    12. late temperature p ** (1/T): dynamic temperature when max_temp > min_temp, else
                         temperature when temperature_last (dynamic replaces it then, as in exllamav2)
    13. XTC              with probability xtc_probability (the job's own coin) drop every token
                         with p >= xtc_threshold except the least probable of them
    14. skew             C_k ** exp(skew) - C_{k-1} ** exp(skew) over the sorted candidates
    15. draw             inverse CDF with one uniform from the job's generator; mirostat mu update

Candidates are ordered by logit, highest first, ties by lower token id, and stay in that order
through every step; the rank-based steps (top_k, top_p, tfs, typical's tie order, XTC's "least
probable", skew, the draw) all use it. The returned probability is the chosen token's in the
final distribution (1.0 for greedy rows).

Determinism: every random number a row uses comes from its own ``SamplerState.generator``
(two uniforms per sampled step: the XTC coin, then the draw), distribution math runs in float64
with a batch-independent candidate order, so a seeded job draws the same tokens alone or in any
batch. Stateful steps (penalties, DRY: token history; mirostat: mu) run per row; everything
else is vectorised across rows, whatever their settings.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Any

import torch

from engine.generator import sampler_steps as steps

logger = logging.getLogger(__name__)

__all__ = ["SampleOutput", "SamplerSettings", "SamplerState", "distribution", "sample", "tokenize_breakers"]

DEFAULT_DRY_SEQUENCE_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")


@dataclass(slots=True)
class SamplerSettings:
    """Sampling settings for a job; defaults follow exllamav2's ``ExLlamaV2Sampler.Settings``.

    Neutral values switch a step off: ``top_k = 0``, ``top_p``/``min_p``/``tfs``/``typical``
    of 0 (or 1 for top_p/tfs/typical), ``top_a = 0``, ``skew = 0``, ``smoothing_factor = 0``,
    ``max_temp <= min_temp``, ``token_repetition_penalty = 1``, ``dry_multiplier = 0``,
    ``xtc_probability = 0``. ``temperature = 0`` or ``top_k = 1`` means greedy.
    ``token_repetition_range = -1`` penalises the whole history. ``dry_range = 0`` searches
    the whole history. ``dry_sequence_breakers`` are strings, tokenised when a job's
    :class:`SamplerState` is made. ``token_bias`` is a ``[V]`` float tensor or ``{id: bias}``.
    ``cfg_scale`` is the guidance scale of a job given a (positive, negative) prompt pair; the generator
    mixes the two rows (see :mod:`engine.generator.cfg`) before :func:`sample`, and a one-prompt job ignores it.

    Every assignment is checked: an unknown name raises ``TypeError`` (constructor) or
    ``AttributeError`` (attribute), a value out of range raises ``ValueError``.
    """

    token_repetition_penalty: float = 1.025
    token_repetition_range: int = -1
    token_repetition_decay: int = 0
    token_frequency_penalty: float = 0.0
    token_presence_penalty: float = 0.0

    temperature: float = 0.8
    smoothing_factor: float = 0.0
    min_temp: float = 0.0
    max_temp: float = 0.0
    temp_exponent: float = 1.0
    temperature_last: bool = False

    top_k: int = 50
    top_p: float = 0.8
    top_a: float = 0.0
    min_p: float = 0.0
    tfs: float = 0.0
    typical: float = 0.0
    skew: float = 0.0

    mirostat: bool = False
    mirostat_tau: float = 1.5
    mirostat_eta: float = 0.1

    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_range: int = 0
    dry_max_ngram: int = 20
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_SEQUENCE_BREAKERS

    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1

    token_bias: torch.Tensor | Mapping[int, float] | None = None
    disallowed_tokens: frozenset[int] = frozenset()
    cfg_scale: float | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        check = _CHECKS.get(name)
        object.__setattr__(self, name, check(name, value) if check is not None else value)

    @classmethod
    def greedy(cls, **overrides: Any) -> SamplerSettings:
        """Settings that always pick the highest logit (after penalties, bias and DRY)."""
        values: dict[str, Any] = {
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 0.0,
            "token_repetition_penalty": 1.0,
        }
        values.update(overrides)
        return cls(**values)

    def clone(self) -> SamplerSettings:
        """A shallow copy (``token_bias`` is shared)."""
        return replace(self)

    def disallow_tokens(self, tokenizer_or_vocab_size: Any, token_ids: Iterable[int]) -> None:
        """Never sample ``token_ids``; each must be in ``[0, vocab_size)``."""
        vocab_size = _vocab_size(tokenizer_or_vocab_size)
        ids = set(self.disallowed_tokens)
        for token_id in token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, Integral):
                raise TypeError(f"disallow_tokens: token ids must be ints, got {token_id!r}")
            if not 0 <= token_id < vocab_size:
                raise ValueError(f"disallow_tokens: token id {token_id} is outside the vocabulary [0, {vocab_size})")
            ids.add(int(token_id))
        self.disallowed_tokens = frozenset(ids)

    @property
    def is_greedy(self) -> bool:
        """True when the sampler takes the argmax for this job."""
        return self.top_k == 1 or self.temperature == 0.0


# ----------------------------------------------------------------------------- checks


def _number(name: str, value: Any, integer: bool) -> float | int:
    kind = Integral if integer else Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"SamplerSettings.{name} must be {'an int' if integer else 'a number'}, got {value!r}")
    if integer:
        return int(value)
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"SamplerSettings.{name} must be a finite number, got {value}")
    return value


def _ranged(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, integer: bool = False):
    def check(name: str, value: Any) -> float | int:
        value = _number(name, value, integer)
        too_low = lo is not None and (value <= lo if lo_open else value < lo)
        too_high = hi is not None and value > hi
        if too_low or too_high:
            low = "-inf" if lo is None else f"{lo:g}"
            high = "inf" if hi is None else f"{hi:g}"
            span = f"{'(' if lo_open or lo is None else '['}{low}, {high}{']' if hi is not None else ')'}"
            raise ValueError(f"SamplerSettings.{name} must be in {span}, got {value:g}")
        return value

    return check


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"SamplerSettings.{name} must be True or False, got {value!r}")
    return value


def _breakers(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(f"SamplerSettings.{name} must be a list of strings, e.g. ['\\n', ':'], got {value!r}")
    value = tuple(value)
    bad = [item for item in value if not isinstance(item, str) or not item]
    if bad:
        raise ValueError(f"SamplerSettings.{name} must hold non-empty strings, got {bad!r}")
    for item in value:
        # A lone surrogate ("\udcff") is no character: the tokenizer would fail on it when the job starts.
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"SamplerSettings.{name} holds {item!r}, which is not valid text ({e.reason}); "
                "pass strings of real characters, e.g. ['\\n', ':']"
            ) from None
    return value


def _token_bias(name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or not value.is_floating_point():
            raise ValueError(
                f"SamplerSettings.{name} tensor must be 1-D float [vocab_size], got {value.dtype} {tuple(value.shape)}"
            )
        return value
    if isinstance(value, Mapping):
        for token_id, bias in value.items():
            if isinstance(token_id, bool) or not isinstance(token_id, Integral) or token_id < 0:
                raise ValueError(f"SamplerSettings.{name} keys must be token ids >= 0, got {token_id!r}")
            if isinstance(bias, bool) or not isinstance(bias, Real) or math.isnan(bias):
                raise ValueError(f"SamplerSettings.{name}[{token_id}] must be a number, got {bias!r}")
        return dict(value)
    raise TypeError(
        f"SamplerSettings.{name} must be None, a [vocab_size] tensor or a dict id -> bias, got {type(value).__name__}"
    )


def _token_set(name: str, value: Any) -> frozenset[int]:
    if not isinstance(value, Iterable) or isinstance(value, str):
        raise TypeError(f"SamplerSettings.{name} must be a collection of token ids, got {value!r}")
    value = frozenset(value)
    bad = [t for t in value if isinstance(t, bool) or not isinstance(t, Integral) or t < 0]
    if bad:
        raise ValueError(f"SamplerSettings.{name} must hold token ids >= 0, got {sorted(map(repr, bad))}")
    return value


def _optional_number(name: str, value: Any) -> float | None:
    return None if value is None else float(_number(name, value, integer=False))


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "token_repetition_penalty": _ranged(0.0, lo_open=True),
    "token_repetition_range": _ranged(-1, integer=True),
    "token_repetition_decay": _ranged(0, integer=True),
    "token_frequency_penalty": _ranged(),
    "token_presence_penalty": _ranged(),
    "temperature": _ranged(0.0),
    "smoothing_factor": _ranged(0.0),
    "min_temp": _ranged(0.0),
    "max_temp": _ranged(0.0),
    "temp_exponent": _ranged(0.0, lo_open=True),
    "temperature_last": _flag,
    "top_k": _ranged(0, integer=True),
    "top_p": _ranged(0.0, 1.0),
    "top_a": _ranged(0.0, 1.0),
    "min_p": _ranged(0.0, 1.0),
    "tfs": _ranged(0.0, 1.0),
    "typical": _ranged(0.0, 1.0),
    "skew": _ranged(),
    "mirostat": _flag,
    "mirostat_tau": _ranged(0.0),
    "mirostat_eta": _ranged(0.0),
    "dry_multiplier": _ranged(0.0),
    "dry_base": _ranged(1.0),
    "dry_allowed_length": _ranged(1, integer=True),
    "dry_range": _ranged(0, integer=True),
    "dry_max_ngram": _ranged(1, integer=True),
    "dry_sequence_breakers": _breakers,
    "xtc_probability": _ranged(0.0, 1.0),
    "xtc_threshold": _ranged(0.0, 1.0),
    "token_bias": _token_bias,
    "disallowed_tokens": _token_set,
    "cfg_scale": _optional_number,
}


def _vocab_size(source: Any) -> int:
    if isinstance(source, Integral) and not isinstance(source, bool):
        return int(source)
    for attr in ("vocab_size", "get_vocab_size"):
        value = getattr(source, attr, None)
        value = value() if callable(value) else value
        if isinstance(value, Integral):
            return int(value)
    config_size = getattr(getattr(source, "config", None), "vocab_size", None)
    if isinstance(config_size, Integral):
        return int(config_size)
    raise TypeError(f"need a vocabulary size or a tokenizer with .vocab_size, got {type(source).__name__}")


# ------------------------------------------------------------------------------ state


def _token_list(encoded: Any) -> list[int]:
    ids = getattr(encoded, "ids", encoded)  # tokenizers.Encoding carries .ids
    return [int(t) for t in torch.as_tensor(ids).flatten().tolist()]


def tokenize_breakers(breakers: Sequence[str], tokenizer: Any) -> list[int]:
    """Token ids of DRY sequence-breaker strings.

    Each string is encoded after a leading ``"a"`` and its last token taken, so tokenizers that
    prepend a space marker (SentencePiece) still give the breaker's own token.
    ``tokenizer`` is a callable ``str -> ids`` or an object with ``encode``.
    """
    encode = tokenizer.encode if hasattr(tokenizer, "encode") else tokenizer
    ids = []
    for text in breakers:
        encoded = _token_list(encode("a" + text))
        if encoded:
            ids.append(encoded[-1])
    return sorted(set(ids))


class SamplerState:
    """Per-job sampler state: one per job, even when jobs share a :class:`SamplerSettings`.

    Holds the job's seeded ``torch.Generator`` (CPU, so draws are the same on every device),
    mirostat's ``mu``, the DRY sequence-breaker ids, and the token history (prompt + generated)
    used by the penalties and DRY. :func:`sample` updates ``mu``; the caller appends each
    accepted token with :meth:`append` and rewinds with :meth:`truncate`.
    """

    def __init__(
        self,
        settings: SamplerSettings | None = None,
        prompt_ids: Sequence[int] | torch.Tensor = (),
        *,
        seed: int | None = None,
        tokenizer: Any = None,
        dry_breaker_ids: Iterable[int] | None = None,
    ) -> None:
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        if isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be None or an int in [0, 2**64), got {seed!r}")
        self.seed = int(seed)
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(self.seed)
        self.mirostat_mu: torch.Tensor | None = None  # 0-d float64, set on first mirostat step
        if dry_breaker_ids is None:
            breakers = settings.dry_sequence_breakers if settings is not None else ()
            if breakers and tokenizer is None and settings is not None and settings.dry_multiplier > 0:
                raise ValueError(
                    "DRY is on (dry_multiplier > 0) but no tokenizer was given to turn "
                    "dry_sequence_breakers into token ids; pass tokenizer= or dry_breaker_ids="
                )
            dry_breaker_ids = tokenize_breakers(breakers, tokenizer) if tokenizer is not None else ()
        self.dry_breaker_ids = torch.tensor(sorted(set(int(t) for t in dry_breaker_ids)), dtype=torch.int64)
        self._tokens = torch.zeros(64, dtype=torch.int64)  # grows by doubling
        self._num_tokens = 0
        self.append(prompt_ids)

    @property
    def history(self) -> torch.Tensor:
        """The job's tokens so far, ``[num_tokens]`` int64 (a view; do not modify)."""
        return self._tokens[: self._num_tokens]

    def append(self, token_ids: int | Sequence[int] | torch.Tensor) -> None:
        """Add accepted tokens to the history (ints, a list, or a tensor on any device)."""
        new = torch.as_tensor(token_ids, dtype=torch.int64).flatten()
        end = self._num_tokens + new.numel()
        if end > self._tokens.numel():
            grown = torch.zeros(max(end, 2 * self._tokens.numel()), dtype=torch.int64, device=self._tokens.device)
            grown[: self._num_tokens] = self.history
            self._tokens = grown
        self._tokens[self._num_tokens : end] = new.to(self._tokens.device)
        self._num_tokens = end

    def truncate(self, num_tokens: int) -> None:
        """Drop history after the first ``num_tokens`` tokens (e.g. a banned-string rewind)."""
        if not 0 <= num_tokens <= self._num_tokens:
            raise ValueError(f"truncate: num_tokens must be in [0, {self._num_tokens}], got {num_tokens}")
        self._num_tokens = num_tokens

    def _history_on(self, device: torch.device) -> torch.Tensor:
        if self._tokens.device != device:
            self._tokens = self._tokens.to(device)
            self.dry_breaker_ids = self.dry_breaker_ids.to(device)
        return self.history


# ----------------------------------------------------------------------------- sample


@dataclass(frozen=True)
class SampleOutput:
    """Result of :func:`sample` for a batch of ``B`` rows.

    ``token_ids [B]`` int64; ``token_probs [B]`` float32, the chosen token's probability in the
    final distribution; ``top_ids``/``top_probs [B, K]`` the ``K = return_top_k`` most probable
    tokens of the final distribution (zero-probability tokens follow in candidate order), or
    None when ``return_top_k = 0``.
    """

    token_ids: torch.Tensor
    token_probs: torch.Tensor
    top_ids: torch.Tensor | None = None
    top_probs: torch.Tensor | None = None


def sample(
    logits: torch.Tensor,
    settings: Sequence[SamplerSettings],
    states: Sequence[SamplerState],
    blocked: Sequence[Collection[int] | None] | None = None,
    return_top_k: int = 0,
) -> SampleOutput:
    """Sample one token per row of ``logits [B, V]``; row ``i`` uses ``settings[i]`` and ``states[i]``.

    ``blocked[i]`` holds ids that row ``i`` may not draw this step. Updates each mirostat
    state's ``mu``; appending the chosen tokens to the states' history is the caller's job (it
    knows which tokens it keeps). Raises ``ValueError`` when a row has no finite logit left
    (every token banned, or NaN/inf logits).

    Device syncs: one to check the logits; DRY rows, a tie across the top_k cut, and trimming a
    candidate list longer than 1024 each add one.
    """
    if logits.dim() != 2:
        raise ValueError(f"sample: logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    num_rows, vocab_size = logits.shape
    if not len(settings) == len(states) == num_rows or (blocked is not None and len(blocked) != num_rows):
        raise ValueError(f"sample: need one settings, state (and blocked entry) per logits row ({num_rows})")
    if not 0 <= return_top_k <= vocab_size:
        raise ValueError(f"sample: return_top_k must be in [0, {vocab_size}], got {return_top_k}")
    device = logits.device
    logits = logits.to(torch.float32, copy=True)  # [B, V]
    _adjust_logits(logits, settings, states, blocked)
    row_max = logits.amax(dim=-1)
    if not bool(torch.isfinite(row_max).all()):
        bad = torch.nonzero(~torch.isfinite(row_max)).flatten().tolist()
        raise ValueError(f"sample: rows {bad} have no finite logit: every token is banned, or the logits hold NaN/inf")

    token_ids = torch.empty(num_rows, dtype=torch.int64, device=device)
    token_probs = torch.empty(num_rows, dtype=torch.float64, device=device)
    top_ids = torch.empty(num_rows, return_top_k, dtype=torch.int64, device=device) if return_top_k else None
    top_probs = torch.empty_like(top_ids, dtype=torch.float64) if top_ids is not None else None
    greedy = [i for i, s in enumerate(settings) if s.is_greedy]
    sampled = [i for i, s in enumerate(settings) if not s.is_greedy]
    outputs = (token_ids, token_probs, top_ids, top_probs)
    if greedy:
        _sample_greedy(logits, greedy, settings, states, outputs)
    if sampled:
        _sample_rows(logits, sampled, settings, states, outputs)
    return SampleOutput(token_ids, token_probs.float(), top_ids, top_probs.float() if top_probs is not None else None)


def _adjust_logits(
    logits: torch.Tensor,
    settings: Sequence[SamplerSettings],
    states: Sequence[SamplerState],
    blocked: Sequence[Collection[int] | None] | None,
) -> None:
    """Steps 1-3 in place: penalties, bias and bans, DRY."""
    vocab_size = logits.shape[-1]
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    for row, (s, state) in enumerate(zip(settings, states, strict=True)):
        if s.token_repetition_penalty != 1.0 or s.token_frequency_penalty != 0.0 or s.token_presence_penalty != 0.0:
            steps.apply_penalties(
                logits[row],
                state._history_on(logits.device),
                s.token_repetition_penalty,
                s.token_frequency_penalty,
                s.token_presence_penalty,
                s.token_repetition_range,
                s.token_repetition_decay,
            )
        if isinstance(s.token_bias, torch.Tensor):
            width = min(vocab_size, s.token_bias.numel())
            logits[row, :width] += s.token_bias[:width].to(logits.device, torch.float32)
        elif s.token_bias:
            bias_ids = [t for t in s.token_bias if t < vocab_size]
            bias = torch.tensor([float(s.token_bias[t]) for t in bias_ids], dtype=torch.float32)
            logits[row].index_add_(
                0, torch.tensor(bias_ids, dtype=torch.int64, device=logits.device), bias.to(logits.device)
            )
        row_bans = [t for t in s.disallowed_tokens if t < vocab_size]
        if blocked is not None and blocked[row]:
            row_bans += [int(t) for t in blocked[row] if 0 <= t < vocab_size]
        ban_rows += [row] * len(row_bans)
        ban_ids += row_bans
    if ban_ids:
        index = (torch.tensor(ban_rows, device=logits.device), torch.tensor(ban_ids, device=logits.device))
        logits.index_put_(index, torch.tensor(-torch.inf, device=logits.device))
    for row, (s, state) in enumerate(zip(settings, states, strict=True)):
        if s.dry_multiplier > 0.0:
            history = state._history_on(logits.device)
            steps.apply_dry(
                logits[row],
                history,
                state.dry_breaker_ids,
                s.dry_multiplier,
                s.dry_base,
                s.dry_allowed_length,
                s.dry_max_ngram,
                s.dry_range,
            )


def _sample_greedy(logits, rows, settings, states, outputs) -> None:
    token_ids, token_probs, top_ids, top_probs = outputs
    index = torch.tensor(rows, device=logits.device)
    sub = logits[index]  # [G, V]
    token_ids[index] = sub.argmax(dim=-1)  # first maximum = lowest id, same tie rule as the sort
    token_probs[index] = 1.0
    if top_ids is not None:
        top_ids[index] = steps.candidate_order(sub, top_ids.shape[-1])
        one_hot = torch.zeros(len(rows), top_ids.shape[-1], dtype=torch.float64, device=logits.device)
        one_hot[:, 0] = 1.0
        top_probs[index] = one_hot
    for row in rows:  # the chosen token has p = 1: surprise 0
        if settings[row].mirostat:
            s, state = settings[row], states[row]
            mu = state.mirostat_mu if state.mirostat_mu is not None else _initial_mu(s, logits.device)
            state.mirostat_mu = mu + s.mirostat_eta * s.mirostat_tau


def _initial_mu(s: SamplerSettings, device: torch.device) -> torch.Tensor:
    return torch.tensor(2.0 * s.mirostat_tau, dtype=torch.float64, device=device)


def _sample_rows(logits, rows, settings, states, outputs) -> None:
    """Steps 4-15 for the non-greedy rows, vectorised across them."""
    token_ids, token_probs, top_ids, top_probs = outputs
    row_settings = [settings[i] for i in rows]
    row_states = [states[i] for i in rows]
    index = torch.tensor(rows, device=logits.device)
    sub = logits if len(rows) == logits.shape[0] else logits[index]  # [R, V]
    num_top = top_ids.shape[-1] if top_ids is not None else 0
    order, probs, uniforms, mirostat_rows = _final_distribution(sub, row_settings, row_states, num_top)
    column = steps.draw(probs, uniforms[:, 1:])  # [R]
    chosen_prob = probs.gather(-1, column[:, None]).squeeze(-1)
    token_ids[index] = order.gather(-1, column[:, None]).squeeze(-1)
    token_probs[index] = chosen_prob
    for j in mirostat_rows:
        s = row_settings[j]
        surprise = -torch.log2(chosen_prob[j])
        row_states[j].mirostat_mu = row_states[j].mirostat_mu - s.mirostat_eta * (surprise - s.mirostat_tau)
    if top_ids is not None:
        # Stable: zero-probability candidates keep the candidate (logit) order.
        ranked = probs.sort(dim=-1, descending=True, stable=True).indices[:, :num_top]
        top_ids[index] = order.gather(-1, ranked)
        top_probs[index] = probs.gather(-1, ranked)


def _final_distribution(sub, row_settings, row_states, num_top):
    """Steps 4-14 for sampled rows ``sub [R, V]``: candidate ids and their final probabilities.

    Returns ``(order [R, W], probs [R, W] float64, uniforms [R, 2], mirostat_rows)``; the second
    uniform of each row is its draw point. Mirostat's ``mu`` is initialised but not updated here.
    """
    device = sub.device
    vocab_size = sub.shape[-1]
    if any(s.top_k == 0 for s in row_settings):
        width = vocab_size
    else:  # only the top_k candidates can survive
        width = min(vocab_size, max(max(s.top_k for s in row_settings), num_top))
    order = steps.candidate_order(sub, width)  # [R, W]
    cand = sub.gather(-1, order).double()  # [R, W]

    # One generator call per row: the XTC coin, then the draw point.
    uniforms = torch.stack([torch.rand(2, generator=st.generator, dtype=torch.float64) for st in row_states]).to(device)

    def col(value: Callable[[SamplerSettings], float]) -> torch.Tensor:  # per-row parameter [R, 1]
        return torch.tensor([[float(value(s))] for s in row_settings], dtype=torch.float64, device=device)

    early_temp = col(lambda s: 1.0 if s.temperature_last else s.temperature)
    probs = steps.softmax_with_temperature(cand, early_temp, col(lambda s: s.smoothing_factor))
    probs = steps.top_k(probs, col(lambda s: s.top_k).long())
    if any(0.0 < s.top_p < 1.0 for s in row_settings):
        probs = steps.top_p(probs, col(lambda s: s.top_p))
    if any(s.top_a > 0.0 for s in row_settings):
        probs = steps.top_a(probs, col(lambda s: s.top_a))
    if any(s.min_p > 0.0 for s in row_settings):
        probs = steps.min_p(probs, col(lambda s: s.min_p))
    if order.shape[-1] > 1024:
        # Every step so far keeps a prefix of each row, so the tail beyond the longest live prefix
        # is all zeros: drop it once (one sync) and run the remaining steps on live candidates.
        width = max(int((probs > 0).sum(dim=-1).max()), num_top)
        probs, order = probs[:, :width], order[:, :width]
    if any(0.0 < s.tfs < 1.0 for s in row_settings):
        probs = steps.tail_free(probs, col(lambda s: s.tfs))
    if any(0.0 < s.typical < 1.0 for s in row_settings):
        probs = steps.typical(probs, col(lambda s: s.typical))
    mirostat_rows = [j for j, s in enumerate(row_settings) if s.mirostat]
    if mirostat_rows:
        for j in mirostat_rows:
            if row_states[j].mirostat_mu is None:
                row_states[j].mirostat_mu = _initial_mu(row_settings[j], device)
        mu = torch.full((len(row_settings), 1), torch.inf, dtype=torch.float64, device=device)  # inf: no limit
        for j in mirostat_rows:
            mu[j, 0] = row_states[j].mirostat_mu
        probs = steps.mirostat_truncate(probs, mu)
    if any(s.max_temp > s.min_temp or (s.temperature_last and s.temperature != 1.0) for s in row_settings):
        late_temp = col(lambda s: s.temperature if s.temperature_last else 1.0)
        dynamic = (col(lambda s: s.min_temp), col(lambda s: s.max_temp), col(lambda s: s.temp_exponent))
        probs = steps.late_temperature(probs, late_temp, *dynamic)
    if any(s.xtc_probability > 0.0 for s in row_settings):
        probs = steps.xtc(probs, col(lambda s: s.xtc_threshold), col(lambda s: s.xtc_probability), uniforms[:, :1])
    if any(s.skew != 0.0 for s in row_settings):
        probs = steps.skew(probs, col(lambda s: s.skew))

    return order, probs, uniforms, mirostat_rows


def distribution(
    logits: torch.Tensor,
    settings: SamplerSettings,
    state: SamplerState,
    blocked: Collection[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The final distribution one :func:`sample` call would draw from, for one row ``logits [V]``.

    Returns ``(token_ids [W], probs [W] float64)`` (zero-probability candidates may be included). A greedy
    row is a point mass on its argmax. Speculative decoding uses it to accept or reject drafted tokens.
    A sampled row takes its two uniforms from ``state.generator`` as :func:`sample` does (the XTC coin
    is used here), so the job's random stream advances the same way. Mirostat rows are not supported: their
    ``mu`` update depends on the token finally chosen.
    """
    if settings.mirostat and not settings.is_greedy:
        raise ValueError("distribution: mirostat rows need the chosen token to update mu; use sample()")
    row = logits.to(torch.float32, copy=True)[None]  # [1, V]
    _adjust_logits(row, [settings], [state], [blocked])
    if not bool(torch.isfinite(row.amax()).item()):
        raise ValueError("distribution: no finite logit: every token is banned, or the logits hold NaN/inf")
    if settings.is_greedy:
        ids = row.argmax(dim=-1)  # [1]
        return ids, torch.ones(1, dtype=torch.float64, device=row.device)
    order, probs, _, _ = _final_distribution(row, [settings], [state], 0)
    return order[0], probs[0] / probs[0].sum()
