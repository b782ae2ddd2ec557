"""GenerationSettings: the one value that says how an answer is generated, from the UI to any backend.

It holds the engine's SamplerSettings, the seed (None = a random one per answer), the answer's length cap
(max_new_tokens) and JSON mode. The store and the sampler panel keep it as a JSON dict: every SamplerSettings
field by name (`dry_sequence_breakers` and `disallowed_tokens` as lists, `token_bias` as {token id: bias} or
None), "seed", "max_new_tokens", and "json_mode": true only when on (absent means off, so chats saved
before JSON mode existed read the same). Dicts read back from JSON have string token-bias keys, and older or
partial dicts lack fields: `from_dict` / `complete_settings` take both. A chat's own switches sit beside
the preset's fields in its dict, each written only when set: "thinking" (enable_thinking), "overflow" and
"reasoning_effort" (a reasoning model's "low", "medium" or "high"); a new preset keeps them
(`with_chat_switches`).

    store / panel dict --from_dict--> GenerationSettings --sampler()--> engine SamplerSettings
                       <--to_dict---                    --seed, max_new_tokens, json_mode--> the job
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Mapping
from typing import Any

from engine import SamplerSettings
from engine.chat.overflow import OverflowPolicy
from engine.reasoning import REASONING_EFFORTS

log = logging.getLogger(__name__)

SAMPLER_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SamplerSettings))
# The settings beside the sampler's: they shape the job rather than each token's choice.
JOB_FIELDS: tuple[str, ...] = ("seed", "max_new_tokens", "json_mode")
MAX_SEED = 2**31 - 1  # seeds are drawn from and edited in [0, MAX_SEED] (a signed 32-bit int, what Qt spins hold)
DEFAULT_MAX_NEW_TOKENS = 1024  # a chat answer's cap
COMPARE_MAX_NEW_TOKENS = 256  # a compare column's: short answers, several side by side
MAX_NEW_TOKENS_LIMIT = 1 << 20  # the panel's upper bound; the model's context is the real limit
# A chat longer than the context: what a chat without its own choice does, kept under this app setting.
OVERFLOW_SETTING = "context_overflow"
DEFAULT_OVERFLOW = OverflowPolicy.TRUNCATE_MIDDLE.value
OVERFLOW_POLICIES: tuple[str, ...] = tuple(p.value for p in OverflowPolicy)


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """How one answer is generated: sampler settings, seed, answer length cap and JSON mode.

    Sampler fields read flat (`settings.temperature`), as remote backends read them; `sampler()` gives the
    engine's SamplerSettings. Change fields with `replace(seed=..., temperature=...)`.
    """

    sampling: SamplerSettings = dataclasses.field(default_factory=SamplerSettings)
    seed: int | None = None  # None: a random seed for each answer (see `seeded`)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    json_mode: bool = False  # hold the answer to one JSON object
    thinking: bool | None = None  # a reasoning model's enable_thinking (template variable); None: its default
    overflow: str | None = None  # a chat longer than the context (OVERFLOW_POLICIES); None: the app's default
    # a reasoning model's reasoning_effort (template variable, one of REASONING_EFFORTS); None: its default
    reasoning_effort: str | None = None

    def __post_init__(self) -> None:
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(
                f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)} (or None for the model's default), "
                f"got {self.reasoning_effort!r}"
            )
        if self.overflow is not None:
            object.__setattr__(self, "overflow", OverflowPolicy.parse(self.overflow).value)
        if self.seed is not None and not 0 <= int(self.seed) <= MAX_SEED:
            raise ValueError(f"seed must be between 0 and {MAX_SEED} (or None for a random one), got {self.seed}")
        if not 1 <= int(self.max_new_tokens) <= MAX_NEW_TOKENS_LIMIT:
            raise ValueError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, got {self.max_new_tokens}")

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: the sampler's fields read as this value's own.
        if name in SAMPLER_FIELDS:
            return getattr(self.sampling, name)
        raise AttributeError(f"{type(self).__name__} has no setting {name!r}")

    def template_options(self) -> dict[str, Any]:
        """The chat template variables these settings set: enable_thinking (Qwen3-style templates) and
        reasoning_effort (gpt-oss's), each only when the chat chose one."""
        options: dict[str, Any] = {}
        if self.thinking is not None:
            options["enable_thinking"] = self.thinking
        if self.reasoning_effort is not None:
            options["reasoning_effort"] = self.reasoning_effort
        return options

    def sampler(self) -> SamplerSettings:
        """The engine's SamplerSettings (a copy: SamplerSettings is mutable, this value is not)."""
        return dataclasses.replace(self.sampling)

    def replace(self, **changes: Any) -> GenerationSettings:
        """A copy with `changes`, which may name sampler fields and job fields alike."""
        sampler_changes = {k: changes.pop(k) for k in list(changes) if k in SAMPLER_FIELDS}
        if sampler_changes:
            changes["sampling"] = _sampler(sampler_changes, over=self.sampling)
        return dataclasses.replace(self, **changes)

    def seeded(self) -> GenerationSettings:
        """These settings with a concrete seed: a random one drawn now when the seed is None, so the seed an
        answer used can be recorded and the answer repeated."""
        return self if self.seed is not None else dataclasses.replace(self, seed=random.randint(0, MAX_SEED))

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any] | None) -> GenerationSettings:
        """From the store's JSON form; missing fields take the defaults, unknown keys are dropped (a preset
        from a newer version stays usable). Raises ValueError for a value the engine refuses."""
        values = complete_settings(settings)
        return cls(
            _sampler({k: values[k] for k in SAMPLER_FIELDS}),
            seed=None if values["seed"] is None else int(values["seed"]),
            max_new_tokens=int(values["max_new_tokens"]),
            json_mode=has_json_mode(settings),
            thinking=thinking_of(settings),
            overflow=overflow_of(settings),
            reasoning_effort=effort_of(settings),
        )

    def to_dict(self) -> dict[str, Any]:
        """The store's JSON form (see the module docstring); "json_mode" only when on."""
        out = _sampler_dict(self.sampling)
        out["seed"] = self.seed
        out["max_new_tokens"] = self.max_new_tokens
        if self.json_mode:
            out["json_mode"] = True
        if self.thinking is not None:
            out["thinking"] = self.thinking
        if self.overflow is not None:
            out["overflow"] = self.overflow
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        return out


def default_settings() -> dict[str, Any]:
    """The defaults as a settings dict, with a random seed."""
    return GenerationSettings().to_dict()


def complete_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """`settings` over the defaults as a settings dict; unknown keys are dropped, token-bias keys made ints.
    Values are not checked here (`sampler_settings` does). JSON mode is the chat's own switch, not part
    of a preset or the panel's dict: it is dropped here and read by `from_dict`."""
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


def sampler_part(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The sampler fields of a settings dict, completed: what tells two presets apart (not seed or length)."""
    values = complete_settings(settings)
    return {name: values[name] for name in SAMPLER_FIELDS}


def has_json_mode(settings: Mapping[str, Any] | None) -> bool:
    """Whether a stored settings dict has JSON mode on (absent means off)."""
    return bool((settings or {}).get("json_mode"))


def with_json_mode(settings: Mapping[str, Any] | None, on: bool) -> dict[str, Any]:
    """A stored settings dict with JSON mode `on`; the key is written only when on, as the store keeps it."""
    out = {k: v for k, v in (settings or {}).items() if k != "json_mode"}
    if on:
        out["json_mode"] = True
    return out


def thinking_of(settings: Mapping[str, Any] | None) -> bool | None:
    """A stored settings dict's thinking switch: True, False, or None (absent: the model's own default). Like
    JSON mode it is the chat's own switch, kept beside the preset's fields."""
    value = (settings or {}).get("thinking")
    return value if isinstance(value, bool) else None


def with_thinking(settings: Mapping[str, Any] | None, on: bool | None) -> dict[str, Any]:
    """A stored settings dict with the thinking switch set (None removes it: the model's default)."""
    out = {k: v for k, v in (settings or {}).items() if k != "thinking"}
    if on is not None:
        out["thinking"] = bool(on)
    return out


def overflow_of(settings: Mapping[str, Any] | None) -> str | None:
    """A stored settings dict's overflow policy, or None (absent or unknown: the app's default). Like the
    thinking switch it is the chat's own, kept beside the preset's fields."""
    value = (settings or {}).get("overflow")
    return value if value in OVERFLOW_POLICIES else None


def with_overflow(settings: Mapping[str, Any] | None, policy: str | None) -> dict[str, Any]:
    """A stored settings dict with the overflow policy set (None removes it: the app's default)."""
    out = {k: v for k, v in (settings or {}).items() if k != "overflow"}
    if policy is not None:
        out["overflow"] = OverflowPolicy.parse(policy).value
    return out


def effort_of(settings: Mapping[str, Any] | None) -> str | None:
    """A stored settings dict's reasoning effort (one of REASONING_EFFORTS), or None (absent or unknown: the
    model's default). Like the thinking switch it is the chat's own, kept beside the preset's fields."""
    value = (settings or {}).get("reasoning_effort")
    return value if value in REASONING_EFFORTS else None


def with_effort(settings: Mapping[str, Any] | None, effort: str | None) -> dict[str, Any]:
    """A stored settings dict with the reasoning effort set (None removes it: the model's default)."""
    out = {k: v for k, v in (settings or {}).items() if k != "reasoning_effort"}
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}")
        out["reasoning_effort"] = effort
    return out


def with_chat_switches(settings: Mapping[str, Any] | None, chat_settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """`settings` (a preset's, the panel's) with the chat's own switches taken from its stored `chat_settings`:
    JSON mode, thinking, overflow policy and reasoning effort, which a preset never changes."""
    out = with_json_mode(settings, has_json_mode(chat_settings))
    out = with_thinking(out, thinking_of(chat_settings))
    out = with_overflow(out, overflow_of(chat_settings))
    return with_effort(out, effort_of(chat_settings))


def sampler_settings(settings: Mapping[str, Any]) -> SamplerSettings:
    """SamplerSettings from a settings dict, strictly: the sampler panel checks every edit with it.

    The job fields ("seed", "max_new_tokens", "json_mode") are allowed and ignored here. JSON forms are
    accepted (string token ids in `token_bias`, lists). Raises ValueError naming an unknown key or a bad value.
    """
    unknown = sorted(set(settings) - set(SAMPLER_FIELDS) - set(JOB_FIELDS))
    if unknown:
        raise ValueError(
            f"unknown sampler setting(s) {', '.join(map(repr, unknown))}; "
            f"known settings are {', '.join(sorted(SAMPLER_FIELDS + JOB_FIELDS))}"
        )
    return _sampler({k: v for k, v in settings.items() if k in SAMPLER_FIELDS})


def _sampler(values: Mapping[str, Any], over: SamplerSettings | None = None) -> SamplerSettings:
    """SamplerSettings from sampler fields (JSON forms allowed), over `over`'s values or the defaults."""
    values = dict(values)
    bias = values.get("token_bias")
    if isinstance(bias, Mapping):
        try:  # JSON object keys are strings
            values["token_bias"] = {int(k): v for k, v in bias.items()}
        except (TypeError, ValueError):
            raise ValueError(f"token_bias keys must be token ids, got {sorted(map(str, bias))[:5]}") from None
    try:
        return dataclasses.replace(over, **values) if over is not None else SamplerSettings(**values)
    except TypeError as e:  # a value of the wrong type is still a bad value for the caller
        raise ValueError(str(e)) from None


def _sampler_dict(settings: SamplerSettings) -> dict[str, Any]:
    """Every field of `settings`, JSON-able."""
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
    return out
