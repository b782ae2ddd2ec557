"""SamplerPanel: every SamplerSettings field of the current chat, presets, seed and answer length."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.service.generation import MAX_NEW_TOKENS_LIMIT, MAX_SEED, SAMPLER_FIELDS, complete_settings, sampler_settings

log = logging.getLogger(__name__)

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


_GROUPS: list[tuple[str, list[Field]]] = [
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
FIELDS: dict[str, Field] = {f.name: f for _, group in _GROUPS for f in group}


class SamplerPanel(QWidget):
    """Edits one chat's settings dict (see app.service.generation); emits `settings_changed(dict)` on edits.

    `store` gives the presets (`list_presets`, `save_preset`, `delete_preset`); without one only the
    fields show.
    """

    settings_changed = Signal(dict)

    def __init__(self, store: Any = None, parent: QWidget | None = None):
        super().__init__(parent)
        missing = set(SAMPLER_FIELDS) - set(FIELDS)
        if missing:  # a new SamplerSettings field must get a control here
            raise RuntimeError(f"SamplerPanel has no control for {sorted(missing)}")
        self._store = store
        self._updating = False
        self._settings = complete_settings(None)
        self._controls: dict[str, QWidget] = {}

        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addLayout(self._build_presets())
        outer.addLayout(self._build_generation())
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setObjectName("errorLabel")
        self.error_label.setVisible(False)
        outer.addWidget(self.error_label)

        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        body = QWidget()
        body_layout = QVBoxLayout(body)
        for title, fields in _GROUPS:
            box = QGroupBox(title)
            form = QFormLayout(box)
            for f in fields:
                form.addRow(f.label, self._make_control(f))
            body_layout.addWidget(box)
        body_layout.addStretch()
        scroll.setWidget(body)
        outer.addWidget(scroll, 1)
        self.reload_presets()
        self.set_settings(self._settings)

    # --- building -------------------------------------------------------------------------------------------

    def _build_presets(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.preset_combo = QComboBox()
        self.preset_combo.setToolTip("Apply a preset to this chat")
        self.preset_combo.activated.connect(self._preset_chosen)
        self.save_preset_button = QPushButton("Save…")
        self.save_preset_button.setToolTip("Save these settings as a preset")
        self.save_preset_button.clicked.connect(self._ask_preset_name)
        self.delete_preset_button = QPushButton("Delete")
        self.delete_preset_button.setToolTip("Delete the selected user preset")
        self.delete_preset_button.clicked.connect(self._delete_selected_preset)
        row.addWidget(QLabel("Preset"))
        row.addWidget(self.preset_combo, 1)
        row.addWidget(self.save_preset_button)
        row.addWidget(self.delete_preset_button)
        return row

    def _build_generation(self) -> QFormLayout:
        form = QFormLayout()
        self.max_new_tokens_spin = QSpinBox()
        self.max_new_tokens_spin.setRange(1, MAX_NEW_TOKENS_LIMIT)
        self.max_new_tokens_spin.setSingleStep(64)
        self.max_new_tokens_spin.setToolTip("Longest answer, in tokens (also capped by the model's context)")
        self.max_new_tokens_spin.valueChanged.connect(self._edited)
        form.addRow("Max answer tokens", self.max_new_tokens_spin)
        seed_row = QHBoxLayout()
        self.fixed_seed_check = QCheckBox("Fixed")
        self.fixed_seed_check.setToolTip("Fixed: the same settings give the same answer. Otherwise random.")
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(0, MAX_SEED)
        self.fixed_seed_check.toggled.connect(self.seed_spin.setEnabled)
        self.fixed_seed_check.toggled.connect(self._edited)
        self.seed_spin.valueChanged.connect(self._edited)
        seed_row.addWidget(self.fixed_seed_check)
        seed_row.addWidget(self.seed_spin, 1)
        form.addRow("Seed", seed_row)
        return form

    def _make_control(self, f: Field) -> QWidget:
        if f.kind == "bool":
            control: QWidget = QCheckBox()
            control.toggled.connect(self._edited)
        elif f.kind == "int":
            control = QSpinBox()
            control.setRange(int(f.lo), int(f.hi))
            control.setSingleStep(int(f.step))
            control.valueChanged.connect(self._edited)
        elif f.kind == "float":
            control = QDoubleSpinBox()
            control.setDecimals(3)
            control.setRange(f.lo, f.hi)
            control.setSingleStep(f.step)
            control.valueChanged.connect(self._edited)
        else:
            control = QLineEdit()
            control.editingFinished.connect(self._edited)
        if f.special and isinstance(control, (QSpinBox, QDoubleSpinBox)):
            control.setSpecialValueText(f.special)
        control.setToolTip(f.tip or f.name)
        control.setObjectName(f.name)
        self._controls[f.name] = control
        return control

    # --- values ---------------------------------------------------------------------------------------------

    def control(self, name: str) -> QWidget:
        """The widget editing field `name` (for tests and keyboard focus)."""
        return self._controls[name]

    def settings(self) -> dict[str, Any]:
        """The settings dict shown (the last valid value of a field whose text does not parse)."""
        return dict(self._settings)

    def set_settings(self, settings: dict[str, Any] | None) -> None:
        """Show `settings` (completed with the defaults) without emitting settings_changed."""
        self._settings = complete_settings(settings)
        self._updating = True
        try:
            for name, control in self._controls.items():
                _show(control, name, self._settings[name])
            self.max_new_tokens_spin.setValue(int(self._settings["max_new_tokens"]))
            seed = self._settings["seed"]
            self.fixed_seed_check.setChecked(seed is not None)
            self.seed_spin.setEnabled(seed is not None)
            if seed is not None:
                self.seed_spin.setValue(int(seed))
        finally:
            self._updating = False
        self._show_error("")

    def _edited(self, *_: Any) -> None:
        if self._updating:
            return
        values = dict(self._settings)
        try:
            for name, control in self._controls.items():
                values[name] = _read(control, name)
            values["max_new_tokens"] = self.max_new_tokens_spin.value()
            values["seed"] = self.seed_spin.value() if self.fixed_seed_check.isChecked() else None
            sampler_settings(values)  # every value checked by the engine's own rules
        except (ValueError, TypeError) as e:
            self._show_error(str(e))
            return
        self._show_error("")
        if values != self._settings:
            self._settings = values
            self.settings_changed.emit(dict(values))

    def _show_error(self, message: str) -> None:
        self.error_label.setText(message)
        self.error_label.setVisible(bool(message))

    # --- presets --------------------------------------------------------------------------------------------

    def reload_presets(self) -> None:
        """Refill the preset list from the store."""
        self.preset_combo.clear()
        self.preset_combo.addItem("Choose a preset…", None)
        if self._store is None:
            return
        for preset in self._store.list_presets():
            label = preset.name if preset.builtin else f"{preset.name} (mine)"
            self.preset_combo.addItem(label, preset.name)

    def preset_names(self) -> list[str]:
        return [self.preset_combo.itemData(i) for i in range(1, self.preset_combo.count())]

    def apply_preset(self, name: str) -> None:
        """Show the preset's settings over the defaults (seed and answer length kept unless it sets them)."""
        preset = next((p for p in self._store.list_presets() if p.name == name), None)
        if preset is None:
            raise ValueError(f"no preset named {name!r}; choose one of {self.preset_names()}")
        values = complete_settings(preset.settings)
        for key in ("seed", "max_new_tokens"):
            if key not in preset.settings:
                values[key] = self._settings[key]
        self.set_settings(values)
        self.settings_changed.emit(self.settings())

    def save_preset(self, name: str) -> None:
        """Save the shown settings as user preset `name` (replacing one of that name)."""
        name = name.strip()
        if not name:
            self._show_error("A preset needs a name.")
            return
        try:
            self._store.save_preset(name, self.settings())
        except ValueError as e:  # e.g. a built-in preset's name
            self._show_error(str(e))
            return
        self.reload_presets()
        self.preset_combo.setCurrentIndex(max(0, self.preset_combo.findData(name)))

    def delete_preset(self, name: str) -> None:
        try:
            self._store.delete_preset(name)
        except (ValueError, KeyError) as e:
            self._show_error(str(e))
            return
        self.reload_presets()

    def _preset_chosen(self, index: int) -> None:
        name = self.preset_combo.itemData(index)
        if name is not None:
            self.apply_preset(name)

    def _ask_preset_name(self) -> None:
        if self._store is None:
            return
        dialog = QInputDialog(self)
        dialog.setWindowTitle("Save preset")
        dialog.setLabelText("Preset name:")
        dialog.textValueSelected.connect(self.save_preset)
        dialog.open()  # not exec(): a nested event loop would re-enter the asyncio loop

    def _delete_selected_preset(self) -> None:
        name = self.preset_combo.currentData()
        if name is not None and self._store is not None:
            self.delete_preset(name)


def _show(control: QWidget, name: str, value: Any) -> None:
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


def _read(control: QWidget, name: str) -> Any:
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
