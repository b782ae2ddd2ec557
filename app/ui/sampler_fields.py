"""The sampler panel's fields: one Field per SamplerSettings value, grouped, and how a control shows and reads it.

BASIC_FIELDS (temperature, top-p, min-p) sit at the top of the panel with the answer
length and seed; every other field sits in the collapsed "Advanced" section, in GROUPS' order.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QLineEdit, QSpinBox, QWidget

_MAX_LEN = 1 << 20


@dataclass(frozen=True)
class Field:
    """One control: `kind` is float, int, bool, or text (a JSON value typed into a line edit)."""

    name: str
    label: str
    kind: str
    lo: float = 0.0
    hi: float = 1.0
    step: float = 0.01
    special: str = ""  # shown instead of the minimum value ("off", "whole history")
    tip: str = ""


GROUPS: list[tuple[str, list[Field]]] = [
    (
        "Temperature",
        [
            Field("temperature", "Temperature", "float", 0.0, 5.0, 0.05, tip="0 = greedy; higher = more varied"),
            Field("temperature_last", "Apply last", "bool", tip="Scale by temperature after truncation"),
            Field("smoothing_factor", "Smoothing", "float", 0.0, 10.0, 0.05, "off", "Quadratic sampling"),
            Field("min_temp", "Dynamic min", "float", 0.0, 5.0, 0.05),
            Field("max_temp", "Dynamic max", "float", 0.0, 5.0, 0.05, tip="Dynamic temperature when max > min"),
            Field("temp_exponent", "Dynamic exponent", "float", 0.01, 10.0, 0.05),
        ],
    ),
    (
        "Truncation",
        [
            Field("top_k", "Top-k", "int", 0, 1000, 1, "off"),
            Field("top_p", "Top-p", "float", 0.0, 1.0, 0.01, "off"),
            Field("min_p", "Min-p", "float", 0.0, 1.0, 0.01, "off"),
            Field("top_a", "Top-a", "float", 0.0, 1.0, 0.01, "off"),
            Field("tfs", "Tail-free", "float", 0.0, 1.0, 0.01, "off"),
            Field("typical", "Typical", "float", 0.0, 1.0, 0.01, "off"),
            Field("skew", "Skew", "float", -5.0, 5.0, 0.05),
        ],
    ),
    (
        "Penalties",
        [
            Field("token_repetition_penalty", "Repetition", "float", 0.01, 3.0, 0.005, tip="1 = off"),
            Field("token_repetition_range", "Range", "int", -1, _MAX_LEN, 64, "whole history"),
            Field("token_repetition_decay", "Decay", "int", 0, _MAX_LEN, 64),
            Field("token_frequency_penalty", "Frequency", "float", -2.0, 2.0, 0.05),
            Field("token_presence_penalty", "Presence", "float", -2.0, 2.0, 0.05),
        ],
    ),
    (
        "DRY",
        [
            Field("dry_multiplier", "Multiplier", "float", 0.0, 5.0, 0.05, "off"),
            Field("dry_base", "Base", "float", 1.0, 4.0, 0.05),
            Field("dry_allowed_length", "Allowed length", "int", 1, 64, 1),
            Field("dry_range", "Range", "int", 0, _MAX_LEN, 64, "whole history"),
            Field("dry_max_ngram", "Max n-gram", "int", 1, 100, 1),
            Field("dry_sequence_breakers", "Breakers", "text", tip='JSON list of strings, e.g. ["\\n", ":"]'),
        ],
    ),
    (
        "Mirostat and XTC",
        [
            Field("mirostat", "Mirostat", "bool"),
            Field("mirostat_tau", "Mirostat tau", "float", 0.0, 20.0, 0.1),
            Field("mirostat_eta", "Mirostat eta", "float", 0.0, 1.0, 0.01),
            Field("xtc_probability", "XTC probability", "float", 0.0, 1.0, 0.01, "off"),
            Field("xtc_threshold", "XTC threshold", "float", 0.0, 1.0, 0.01),
        ],
    ),
    (
        "Tokens",
        [
            Field("token_bias", "Token bias", "text", tip='JSON object token id -> bias, e.g. {"42": -5}'),
            Field("disallowed_tokens", "Disallowed", "text", tip="JSON list of token ids, e.g. [13, 42]"),
            Field(
                "cfg_scale",
                "CFG scale",
                "text",
                tip="Classifier-free guidance strength: a number, or empty for none. The engine applies it to jobs "
                "given a (positive, negative) prompt pair; the app's chats send no negative prompt yet, so here "
                "it is saved with the chat's settings but changes no answer",
            ),
        ],
    ),
]
FIELDS: dict[str, Field] = {f.name: f for _, group in GROUPS for f in group}

# Shown first, the settings LM Studio and Jan also show first; the rest are "Advanced".
BASIC_FIELDS: tuple[str, ...] = ("temperature", "top_p", "min_p")


def make_control(f: Field, on_edit: Callable[..., None]) -> QWidget:
    """A control for `f`, named after the field, calling `on_edit` whenever the user changes it."""
    if f.kind == "bool":
        control: QWidget = QCheckBox()
        control.toggled.connect(on_edit)
    elif f.kind == "int":
        control = QSpinBox()
        control.setRange(int(f.lo), int(f.hi))
        control.setSingleStep(int(f.step))
        control.valueChanged.connect(on_edit)
    elif f.kind == "float":
        control = QDoubleSpinBox()
        control.setDecimals(3)
        control.setRange(f.lo, f.hi)
        control.setSingleStep(f.step)
        control.valueChanged.connect(on_edit)
    else:
        control = QLineEdit()
        control.editingFinished.connect(on_edit)
    if f.special and isinstance(control, (QSpinBox, QDoubleSpinBox)):
        control.setSpecialValueText(f.special)
    control.setToolTip(f.tip or f.name)
    control.setObjectName(f.name)
    return control


def show_value(control: QWidget, name: str, value: Any) -> None:
    if isinstance(control, QCheckBox):
        control.setChecked(bool(value))
    elif isinstance(control, QSpinBox):
        control.setValue(int(value))
    elif isinstance(control, QDoubleSpinBox):
        control.setValue(float(value))
    elif isinstance(control, QLineEdit):
        text = "" if value is None or value == [] or value == {} else json.dumps(value, ensure_ascii=False)
        control.setText(text)
        control.setCursorPosition(0)


def read_value(control: QWidget, name: str) -> Any:
    if isinstance(control, QCheckBox):
        return control.isChecked()
    if isinstance(control, QSpinBox):
        return control.value()
    if isinstance(control, QDoubleSpinBox):
        return round(control.value(), control.decimals())
    text = control.text().strip()
    if name == "cfg_scale":
        if not text:
            return None
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"CFG scale must be a number or empty, got {text!r}") from None
    empty = {"token_bias": None, "disallowed_tokens": [], "dry_sequence_breakers": []}[name]
    if not text:
        return empty
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{FIELDS[name].label}: {text!r} is not valid JSON ({e.msg}); {FIELDS[name].tip}") from None
    if name == "token_bias":
        if not isinstance(value, dict):
            raise ValueError(f"Token bias must be a JSON object of token id -> bias, got {text!r}")
        try:
            return {int(k): float(v) for k, v in value.items()} or None
        except (TypeError, ValueError):
            raise ValueError(f"Token bias keys must be token ids and values numbers, got {text!r}") from None
    if not isinstance(value, list):
        raise ValueError(f"{FIELDS[name].label} must be a JSON list, got {text!r}")
    return sorted(value) if name == "disallowed_tokens" and all(isinstance(v, int) for v in value) else value
