"""SamplerSettings: a job's sampling settings, each checked when it is assigned.

What each setting does, and in which order the sampler applies them, is in :mod:`engine.generator.sampler`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Any

import torch

__all__ = ["DEFAULT_DRY_SEQUENCE_BREAKERS", "SamplerSettings"]

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
    mixes the two rows (see :mod:`engine.generator.guidance`) before :func:`sample`, and a one-prompt job ignores it.

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
