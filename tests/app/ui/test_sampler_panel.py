"""The sampler panel: every SamplerSettings field round-trips through its control; presets; seed.

Bad inputs tried: token bias "not json", "[1, 2]" and {"x": 1}; disallowed tokens "{}" and [-3]; DRY breakers
"[\\"\\"]" (an empty breaker); CFG scale "big"; saving a preset under a built-in's name and with an empty
name; deleting a built-in preset.

Layout: the basics (presets, temperature, top-p, min-p, answer length, seed) show; the rest sit in a collapsed
"Advanced" section whose open state the store keeps. The system prompt is edited in the chat tab, not here.
"""

from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QLineEdit, QSpinBox

from app.service import sampler_settings
from app.service.generation import complete_settings
from app.ui.sampler_fields import BASIC_FIELDS
from app.ui.sampler_panel import ADVANCED_OPEN_SETTING, FIELDS, SamplerPanel
from engine import SamplerSettings

# A value for every field, each different from SamplerSettings' default and inside the control's range.
CHANGED = {
    "token_repetition_penalty": 1.15,
    "token_repetition_range": 512,
    "token_repetition_decay": 128,
    "token_frequency_penalty": 0.25,
    "token_presence_penalty": -0.5,
    "temperature": 1.35,
    "smoothing_factor": 0.3,
    "min_temp": 0.2,
    "max_temp": 1.6,
    "temp_exponent": 1.5,
    "temperature_last": True,
    "top_k": 17,
    "top_p": 0.92,
    "top_a": 0.1,
    "min_p": 0.07,
    "tfs": 0.95,
    "typical": 0.9,
    "skew": 0.4,
    "mirostat": True,
    "mirostat_tau": 4.0,
    "mirostat_eta": 0.2,
    "dry_multiplier": 0.8,
    "dry_base": 2.0,
    "dry_allowed_length": 3,
    "dry_range": 1024,
    "dry_max_ngram": 12,
    "dry_sequence_breakers": ["\n", "."],
    "xtc_probability": 0.5,
    "xtc_threshold": 0.2,
    "token_bias": {5: -2.5, 42: 1.0},
    "disallowed_tokens": [3, 9],
    "cfg_scale": 1.5,
}


@pytest.fixture
def panel(qtbot, app_store):
    p = SamplerPanel(app_store)
    qtbot.addWidget(p)
    return p


def type_into(panel: SamplerPanel, name: str, value) -> None:
    """Edit a field the way a user does: through its control."""
    control = panel.control(name)
    if isinstance(control, QCheckBox):
        control.setChecked(value)
    elif isinstance(control, (QSpinBox, QDoubleSpinBox)):
        control.setValue(value)
    else:
        assert isinstance(control, QLineEdit)
        import json

        control.setText("" if value is None else json.dumps(value))
        control.editingFinished.emit()


def test_every_field_has_a_control_and_round_trips_to_sampler_settings(panel, qtbot):
    assert set(FIELDS) == {f.name for f in dataclasses.fields(SamplerSettings)}
    assert set(CHANGED) == set(FIELDS)
    defaults = SamplerSettings()
    for name, value in CHANGED.items():
        assert getattr(defaults, name) != value or name == "token_bias", name
    emitted = []
    panel.settings_changed.connect(emitted.append)
    for name, value in CHANGED.items():
        type_into(panel, name, value)
    panel.max_new_tokens_spin.setValue(333)
    panel.fixed_seed_check.setChecked(True)
    panel.seed_spin.setValue(4242)
    settings = panel.settings()
    assert emitted[-1] == settings
    assert settings["max_new_tokens"] == 333 and settings["seed"] == 4242
    built = sampler_settings(settings)
    expected = SamplerSettings(
        **{
            **CHANGED,
            "dry_sequence_breakers": tuple(CHANGED["dry_sequence_breakers"]),
            "disallowed_tokens": frozenset(CHANGED["disallowed_tokens"]),
        }
    )
    for name in FIELDS:
        assert getattr(built, name) == getattr(expected, name), name

    # and back: a fresh panel shows the same dict, also after a JSON round trip (string token-bias keys)
    other = SamplerPanel()
    qtbot.addWidget(other)
    other.set_settings(settings)
    assert other.settings() == settings
    import json

    other.set_settings(json.loads(json.dumps(settings)))
    assert other.settings() == settings


def test_set_settings_does_not_emit_and_completes_missing_keys(panel):
    emitted = []
    panel.settings_changed.connect(emitted.append)
    panel.set_settings({"temperature": 0.3})
    assert emitted == []
    shown = panel.settings()
    assert shown["temperature"] == 0.3 and shown["top_k"] == SamplerSettings().top_k
    assert shown == complete_settings({"temperature": 0.3})
    assert panel.control("temperature").value() == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("token_bias", "not json"),
        ("token_bias", "[1, 2]"),
        ("token_bias", '{"x": 1}'),
        ("disallowed_tokens", "{}"),
        ("disallowed_tokens", "[-3]"),
        ("dry_sequence_breakers", '[""]'),
        ("cfg_scale", "big"),
    ],
)
def test_bad_text_fields_show_an_error_and_keep_the_last_good_value(panel, name, text):
    before = panel.settings()
    emitted = []
    panel.settings_changed.connect(emitted.append)
    panel.control(name).setText(text)
    panel.control(name).editingFinished.emit()
    assert emitted == [] and panel.settings() == before
    assert panel.error_label.isVisibleTo(panel) and panel.error_label.text()
    panel.control(name).setText("")  # clearing the field fixes it
    panel.control(name).editingFinished.emit()
    assert not panel.error_label.isVisibleTo(panel)


def test_builtin_presets_apply(panel, app_store):
    names = panel.preset_names()
    assert names[:4] == ["Greedy", "Balanced", "Creative", "Precise"]
    panel.fixed_seed_check.setChecked(True)
    panel.seed_spin.setValue(99)
    emitted = []
    panel.settings_changed.connect(emitted.append)
    for preset in app_store.presets.all()[:4]:
        panel.preset_combo.setCurrentIndex(panel.preset_combo.findData(preset.name))
        panel.preset_combo.activated.emit(panel.preset_combo.currentIndex())
        shown = panel.settings()
        for key, value in preset.settings.items():
            assert shown[key] == value, key
        assert shown["seed"] == 99  # presets without a seed keep the chosen one
        assert emitted[-1] == shown
    assert sampler_settings(panel.settings()).top_k == next(
        p for p in app_store.presets.all() if p.name == "Precise"
    ).settings.get("top_k", SamplerSettings().top_k)


def test_user_presets_save_apply_delete(panel, app_store):
    type_into(panel, "temperature", 0.42)
    type_into(panel, "top_k", 7)
    panel.save_preset("  Mine  ")
    assert "Mine" in panel.preset_names()
    saved = next(p for p in app_store.presets.all() if p.name == "Mine")
    assert not saved.builtin and saved.settings["temperature"] == pytest.approx(0.42)
    type_into(panel, "temperature", 1.5)
    panel.apply_preset("Mine")
    assert panel.settings()["temperature"] == pytest.approx(0.42) and panel.settings()["top_k"] == 7

    panel.save_preset("Greedy")  # a built-in's name
    assert "built-in" in panel.error_label.text()
    panel.save_preset("   ")
    assert "name" in panel.error_label.text()
    panel.delete_preset("Balanced")
    assert "built-in" in panel.error_label.text() and "Balanced" in panel.preset_names()
    panel.delete_preset("Mine")
    assert "Mine" not in panel.preset_names()
    assert [p.name for p in app_store.presets.all()] == ["Greedy", "Balanced", "Creative", "Precise"]
    with pytest.raises(ValueError, match="no preset named"):
        panel.apply_preset("Mine")


def test_seed_random_or_fixed(panel):
    assert panel.settings()["seed"] is None and not panel.seed_spin.isEnabled()
    panel.fixed_seed_check.setChecked(True)
    assert panel.seed_spin.isEnabled()
    panel.seed_spin.setValue(123)
    assert panel.settings()["seed"] == 123
    panel.fixed_seed_check.setChecked(False)
    assert panel.settings()["seed"] is None


def test_basics_show_and_the_rest_sit_in_a_collapsed_advanced_section(panel):
    assert set(BASIC_FIELDS) == {"temperature", "top_p", "min_p"}
    assert not panel.advanced.is_open and not panel.advanced.body.isVisibleTo(panel)
    assert panel.advanced.toggle.text() == "▸ Advanced"
    basics = [panel.control(name) for name in BASIC_FIELDS]
    basics += [panel.max_new_tokens_spin, panel.fixed_seed_check, panel.seed_spin, panel.preset_combo]
    for control in basics:
        assert control.isVisibleTo(panel) and not panel.advanced.isAncestorOf(control), control.objectName()
    advanced = set(FIELDS) - set(BASIC_FIELDS)
    assert len(advanced) == len(FIELDS) - 3
    for name in advanced:
        control = panel.control(name)
        assert panel.advanced.body.isAncestorOf(control) and not control.isVisibleTo(panel), name

    panel.advanced.toggle.click()
    assert panel.advanced.is_open and panel.advanced.toggle.text() == "▾ Advanced"
    assert all(panel.control(name).isVisibleTo(panel) for name in advanced)


def test_advanced_section_remembers_whether_it_was_open(qtbot, app_store):
    assert app_store.get_setting(ADVANCED_OPEN_SETTING) is None
    first = SamplerPanel(app_store)
    qtbot.addWidget(first)
    first.advanced.toggle.click()
    assert app_store.get_setting(ADVANCED_OPEN_SETTING) is True

    reopened = SamplerPanel(app_store)
    qtbot.addWidget(reopened)
    assert reopened.advanced.is_open and reopened.advanced.body.isVisibleTo(reopened)
    reopened.advanced.toggle.click()
    assert app_store.get_setting(ADVANCED_OPEN_SETTING) is False
    closed = SamplerPanel(app_store)
    qtbot.addWidget(closed)
    assert not closed.advanced.is_open

    storeless = SamplerPanel()  # a panel without a store starts closed and has nowhere to save it
    qtbot.addWidget(storeless)
    assert not storeless.advanced.is_open
    storeless.advanced.toggle.click()
    assert storeless.advanced.is_open


@pytest.mark.parametrize("is_open", [False, True])
def test_every_field_edits_the_settings_whether_advanced_is_open_or_not(qtbot, app_store, is_open):
    app_store.set_setting(ADVANCED_OPEN_SETTING, is_open)
    panel = SamplerPanel(app_store)
    qtbot.addWidget(panel)
    assert panel.advanced.is_open is is_open
    emitted = []
    panel.settings_changed.connect(emitted.append)
    for name, value in CHANGED.items():
        type_into(panel, name, value)
        assert emitted[-1][name] == value, name
    assert {name: panel.settings()[name] for name in CHANGED} == CHANGED
