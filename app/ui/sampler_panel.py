"""SamplerPanel: every SamplerSettings field of the current chat, presets, seed and answer length.

The basics (presets, temperature, top-p, min-p, answer length, seed) show first; every other field sits in a
collapsed "Advanced" section whose open state the store remembers. The chat's system prompt is edited in the
chat tab, beside the conversation it shapes.
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.service.generation import (
    DEFAULT_OVERFLOW,
    MAX_NEW_TOKENS_LIMIT,
    MAX_SEED,
    SAMPLER_FIELDS,
    complete_settings,
    sampler_settings,
)
from app.ui.collapsible_section import CollapsibleSection
from app.ui.sampler_fields import BASIC_FIELDS, FIELDS, GROUPS, Field, make_control, read_value, show_value

__all__ = ["ADVANCED_OPEN_SETTING", "FIELDS", "SamplerPanel"]

log = logging.getLogger(__name__)

# Whether the "Advanced" section was open, remembered across panels and restarts.
ADVANCED_OPEN_SETTING = "sampler_panel.advanced_open"
# What a chat does past the model's context: (policy, shown as); None is the app's default.
OVERFLOW_CHOICES: tuple[tuple[str | None, str], ...] = (
    (None, f"Default ({DEFAULT_OVERFLOW.replace('-', ' ')})"),
    ("stop", "Stop at the limit"),
    ("truncate-middle", "Truncate the middle"),
    ("rolling-window", "Rolling window"),
)


class SamplerPanel(QWidget):
    """Edits one chat's settings dict (see app.service.generation); emits `settings_changed(dict)` on edits.

    `store` gives the presets (`list_presets`, `save_preset`, `delete_preset`); without one only the
    fields show.
    """

    settings_changed = Signal(dict)
    overflow_changed = Signal(object)  # the chat's context-overflow policy (None: the app's default)

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

        # The basics stay in view; the rest scrolls, folded away until the user opens it.
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        body = QWidget()
        body_layout = QVBoxLayout(body)
        self.advanced = self._build_advanced()
        body_layout.addWidget(self.advanced)
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
        for name in BASIC_FIELDS:
            form.addRow(FIELDS[name].label, self._add_control(FIELDS[name]))
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
        self.overflow_combo = QComboBox()
        for policy, label in OVERFLOW_CHOICES:
            self.overflow_combo.addItem(label, policy)
        self.overflow_combo.setToolTip(
            "When the chat outgrows the model's context: stop, or leave the oldest turns out of the prompt (they "
            "stay in the chat, under a divider) and keep answering"
        )
        self.overflow_combo.activated.connect(lambda i: self.overflow_changed.emit(self.overflow_combo.itemData(i)))
        form.addRow("Context overflow", self.overflow_combo)
        return form

    def set_overflow(self, policy: str | None) -> None:
        """Show the chat's overflow policy (None: the app's default) without emitting overflow_changed."""
        self.overflow_combo.setCurrentIndex(max(0, self.overflow_combo.findData(policy)))

    @property
    def overflow(self) -> str | None:
        return self.overflow_combo.currentData()

    def _build_advanced(self) -> CollapsibleSection:
        body = QWidget()
        body_layout = QVBoxLayout(body)
        body_layout.setContentsMargins(0, 0, 0, 0)
        for title, fields in GROUPS:
            rest = [f for f in fields if f.name not in BASIC_FIELDS]
            if not rest:
                continue
            box = QGroupBox(title)
            form = QFormLayout(box)
            for f in rest:
                form.addRow(f.label, self._add_control(f))
            body_layout.addWidget(box)
        section = CollapsibleSection("Advanced", body)
        section.toggle.setToolTip("Every other sampler setting; opens and closes with a click")
        if self._store is not None:
            section.set_open(bool(self._store.get_setting(ADVANCED_OPEN_SETTING, False)))
            section.toggled.connect(lambda is_open: self._store.set_setting(ADVANCED_OPEN_SETTING, is_open))
        return section

    def _add_control(self, f: Field) -> QWidget:
        control = make_control(f, self._edited)
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
                show_value(control, name, self._settings[name])
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
                values[name] = read_value(control, name)
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
        for preset in self._store.presets.all():
            label = preset.name if preset.builtin else f"{preset.name} (mine)"
            self.preset_combo.addItem(label, preset.name)

    def preset_names(self) -> list[str]:
        return [self.preset_combo.itemData(i) for i in range(1, self.preset_combo.count())]

    def apply_preset(self, name: str) -> None:
        """Show the preset's settings over the defaults (seed and answer length kept unless it sets them)."""
        preset = next((p for p in self._store.presets.all() if p.name == name), None)
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
            self._store.presets.save(name, self.settings())
        except ValueError as e:  # e.g. a built-in preset's name
            self._show_error(str(e))
            return
        self.reload_presets()
        self.preset_combo.setCurrentIndex(max(0, self.preset_combo.findData(name)))

    def delete_preset(self, name: str) -> None:
        try:
            self._store.presets.delete(name)
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
