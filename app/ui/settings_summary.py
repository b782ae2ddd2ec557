"""One line that says what a settings dict is: its preset's name (or "Custom") and the fields that differ from
the defaults, e.g. "Precise · temperature 0.3 · top-p 0.85 · min-p 0.05 · +3 more".

The compare view folds each column's settings to this line, so the answers get the room. The job fields (seed,
answer length) come first when they differ from the column's own defaults, since columns that share a preset
differ only there; then the basics the panel shows first, then the rest in the panel's order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.service.generation import complete_settings, sampler_part
from app.ui.sampler_fields import BASIC_FIELDS, FIELDS, GROUPS

SHOWN_FIELDS = 3  # more would not fit a column's width; the tooltip lists them all
CUSTOM = "Custom"

# The panel's labels sit under a group title ("Range" under Penalties and under DRY); alone they need it.
_NAMES = {
    "token_repetition_penalty": "repetition penalty",
    "token_repetition_range": "repetition range",
    "token_repetition_decay": "repetition decay",
    "token_frequency_penalty": "frequency penalty",
    "token_presence_penalty": "presence penalty",
    "temperature_last": "temperature last",
    "smoothing_factor": "smoothing",
    "min_temp": "dynamic temperature min",
    "max_temp": "dynamic temperature max",
    "temp_exponent": "dynamic temperature exponent",
    "dry_multiplier": "DRY multiplier",
    "dry_base": "DRY base",
    "dry_allowed_length": "DRY allowed length",
    "dry_range": "DRY range",
    "dry_max_ngram": "DRY max n-gram",
    "dry_sequence_breakers": "DRY breakers",
}
_ORDER = list(BASIC_FIELDS) + [f.name for _, fields in GROUPS for f in fields if f.name not in BASIC_FIELDS]
GREEDY = "greedy"
# A greedy row (top-k 1 or temperature 0) takes the argmax after penalties, bans and DRY: the sampler skips every
# step after them (engine/generator/sampler.py), so these fields change nothing and the summary says "greedy".
_MOOT_WHEN_GREEDY = frozenset(
    {
        *("temperature", "temperature_last", "smoothing_factor", "min_temp", "max_temp", "temp_exponent"),
        *("top_k", "top_p", "top_a", "min_p", "tfs", "typical", "skew"),
        *("mirostat", "mirostat_tau", "mirostat_eta", "xtc_probability", "xtc_threshold"),
    }
)
# Values that switch a penalty off read as "no ..." rather than as a number.
_NEUTRAL = {"token_repetition_penalty": 1.0, "token_frequency_penalty": 0.0, "token_presence_penalty": 0.0}


def field_name(name: str) -> str:
    """How the summary names a settings field ("top-p", "repetition penalty")."""
    return _NAMES.get(name) or FIELDS[name].label.lower()


def _value(name: str, value: Any) -> str:
    f = FIELDS[name]
    if f.special and isinstance(value, (int, float)) and not isinstance(value, bool) and value == f.lo:
        return f.special  # the panel shows "off" there too
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _item(name: str, value: Any) -> str:
    if name in _NEUTRAL and value == _NEUTRAL[name]:
        return f"no {field_name(name)}"
    if isinstance(value, bool):
        return field_name(name) if value else f"no {field_name(name)}"
    return f"{field_name(name)} {_value(name, value)}"


def differences(settings: Mapping[str, Any], job_defaults: Mapping[str, Any]) -> list[str]:
    """The fields of `settings` that differ, as "name value" items: the job fields ("seed", "max_new_tokens")
    from `job_defaults`, the sampler fields from the engine's defaults."""
    values = complete_settings(settings)
    items = []
    if "seed" in job_defaults and values["seed"] != job_defaults["seed"]:
        items.append("random seed" if values["seed"] is None else f"seed {values['seed']}")
    if "max_new_tokens" in job_defaults and values["max_new_tokens"] != job_defaults["max_new_tokens"]:
        items.append(f"{values['max_new_tokens']} tokens")
    defaults, mine = sampler_part(None), sampler_part(values)
    greedy = mine["top_k"] == 1 or mine["temperature"] == 0
    if greedy:
        items.append(GREEDY)
    moot = _MOOT_WHEN_GREEDY if greedy else frozenset()
    items += [_item(name, mine[name]) for name in _ORDER if mine[name] != defaults[name] and name not in moot]
    return items


def summary(settings: Mapping[str, Any], preset: str | None, job_defaults: Mapping[str, Any]) -> str:
    """One line: `preset` (None: "Custom") and the first SHOWN_FIELDS differences, "+N more" for the rest."""
    items = _besides(preset, differences(settings, job_defaults))
    shown = items[:SHOWN_FIELDS] + ([f"+{len(items) - SHOWN_FIELDS} more"] if len(items) > SHOWN_FIELDS else [])
    return " · ".join([preset or CUSTOM, *shown])


def full_summary(settings: Mapping[str, Any], preset: str | None, job_defaults: Mapping[str, Any]) -> str:
    """Every difference, one a line under the preset's name (the folded line's tooltip)."""
    items = _besides(preset, differences(settings, job_defaults)) or ["the defaults"]
    return "\n".join([preset or CUSTOM, *items])


def _besides(preset: str | None, items: list[str]) -> list[str]:
    """The items without one that only repeats the preset's name (the Greedy preset is greedy)."""
    return [item for item in items if preset is None or item != preset.lower()]
