"""A compare column's settings fold to one summary line: new columns start folded, the line names the preset and
the fields that differ, edits made while unfolded show in it, and folded the answer gets the column's height.
The real view on the session's EngineService (tiny model) and a real store."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.ui.compare_view import CompareView


@pytest.fixture
def view(qtbot, app_store, engine_service):
    v = CompareView(app_store, engine_service)
    qtbot.addWidget(v)
    v.resize(1400, 800)
    v.show()
    qtbot.waitExposed(v)
    return v


def summary_line(column) -> str:
    return column.settings_section.toggle.text()


def test_new_columns_start_folded_with_their_preset_and_its_differences(view, app_store):
    presets = app_store.presets.all()
    view.set_column_count(4)
    for column, preset in zip(view.columns, presets):
        assert column.is_folded() and not column.panel.isVisible()
        assert summary_line(column).startswith(f"▸ {preset.name} · ")
    greedy = next(c for c in view.columns if c.preset_name() == "Greedy")
    # Greedy against the engine's defaults (temperature 0.8, top-p 0.8, top-k 50, repetition penalty 1.025): top-k 1
    # makes temperature and top-p moot, so the line names it greedy (the preset's name says so) and what still counts.
    assert summary_line(greedy) == "▸ Greedy · no repetition penalty"
    assert "temperature" not in greedy.settings_section.toggle.toolTip()


def test_editing_while_unfolded_updates_the_summary_and_folds_again(view, qtbot):
    column = view.columns[1]  # Balanced: a sampling preset, where temperature counts (Greedy's ignores it)
    qtbot.mouseClick(column.settings_section.toggle, Qt.MouseButton.LeftButton)
    assert not column.is_folded() and column.panel.isVisible()
    column.panel.control("temperature").setValue(0.25)  # as typing in the spin box does
    assert summary_line(column).startswith("▾ Custom · temperature 0.25 · ")
    column.panel.seed_spin.setValue(7)
    assert summary_line(column).startswith("▾ Custom · seed 7 · temperature 0.25 · ")
    column.panel.apply_preset("Precise")
    assert summary_line(column).startswith("▾ Precise · seed 7 · temperature 0.3 · ")
    qtbot.mouseClick(column.settings_section.toggle, Qt.MouseButton.LeftButton)
    assert column.is_folded() and not column.panel.isVisible()
    assert summary_line(column).startswith("▸ Precise · seed 7 · ")
    assert column.settings()["temperature"] == 0.3 and column.settings()["seed"] == 7


def test_the_answer_is_taller_folded_than_unfolded(view, qtbot):
    column = view.columns[1]
    folded = column.output.height()
    column.set_folded(False)
    qtbot.waitUntil(lambda: column.output.height() < folded)
    unfolded = column.output.height()
    # Folded, the settings take one line: the answer gets nearly all the room the panel had.
    assert folded - unfolded > 150, (folded, unfolded)
    column.set_folded(True)
    qtbot.waitUntil(lambda: column.output.height() == folded)
