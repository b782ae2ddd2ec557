"""The GUI-thread collector (app/gui_gc.py): what lived when it started is left out of every collection until it
stops, and what comes later is collected as before."""

from __future__ import annotations

import gc
import weakref

from app.gui_gc import GuiThreadCollector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_objects_alive_at_start_are_frozen_and_later_cycles_are_collected(qapp):
    kept = _Node()
    collector = GuiThreadCollector(qapp, interval_ms=60_000)
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # the imported modules: torch's, Qt's, the app's
        later = _Node()
        dead = weakref.ref(later)
        del later
        gc.collect()
        assert dead() is None  # a cycle made after the start is collected
        assert kept.me is kept
    finally:
        collector.stop()
    assert gc.get_freeze_count() == 0  # thawed, so the interpreter's exit frees them
