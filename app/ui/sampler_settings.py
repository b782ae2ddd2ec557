"""The chat's settings dict (what the store keeps) <-> `engine.SamplerSettings`.

A settings dict is JSON: every SamplerSettings field by name, with `dry_sequence_breakers` and
`disallowed_tokens` as lists and `token_bias` as {token id: bias} or None, plus "seed" (None = random)
and "max_new_tokens". A dict read back from JSON has string token-bias keys; `complete_settings` turns
them back into ints. Older or partial dicts are completed with the defaults.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from engine import SamplerSettings

log = logging.getLogger(__name__)

GENERATION_KEYS = ("seed", "max_new_tokens")
DEFAULT_MAX_NEW_TOKENS = 1024
SAMPLER_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SamplerSettings))


def default_settings() -> dict[str, Any]:
    """SamplerSettings' defaults as a settings dict, with a random seed."""
    return to_settings_dict(SamplerSettings(), seed=None, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)


def to_settings_dict(settings: SamplerSettings, *, seed: int | None, max_new_tokens: int) -> dict[str, Any]:
    """A JSON-able settings dict holding every field of `settings`."""
    out: dict[str, Any] = {}
    for name in SAMPLER_FIELDS:
        value = getattr(settings, name)
        if name == "dry_sequence_breakers":
            value = list(value)
        elif name == "disallowed_tokens":
            value = sorted(value)
        elif name == "token_bias":
            if value is not None and not isinstance(value, dict):
                raise ValueError("a tensor token_bias cannot be saved with a chat; use a dict of token id -> bias")
            value = None if not value else {int(k): float(v) for k, v in sorted(value.items())}
        out[name] = value
    out["seed"] = seed
    out["max_new_tokens"] = max_new_tokens
    return out


def complete_settings(settings: dict[str, Any] | None) -> dict[str, Any]:
    """`settings` over the defaults; unknown keys are dropped (a preset from a newer version stays usable)."""
    out = default_settings()
    for key, value in (settings or {}).items():
        if key in out:
            out[key] = value
    bias = out["token_bias"]
    try:
        out["token_bias"] = {int(k): float(v) for k, v in bias.items()} if bias else None
    except (AttributeError, TypeError, ValueError):
        log.warning("ignoring a token_bias that is not {token id: bias}: %r", bias)
        out["token_bias"] = None
    return out
