"""The Qt binding keeps Python's reference counts: PySide6 6.12.0 on Python 3.11 took one reference from None
on every Qt method call that returns nothing and one from True on every emit of a bool, so the app aborted
("none_dealloc: deallocating None") after a few thousand calls of a streaming answer. pyproject.toml holds
PySide6 below 6.12; this fails on a binding with that bug (on Python 3.12+ None is immortal and it passes)."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel


class _Emitter(QObject):
    flag = Signal(bool)


def test_void_calls_and_bool_emits_leave_none_and_true_alone(qapp):
    label, emitter = QLabel(), _Emitter()
    emitter.flag.connect(lambda value: None)
    none_before, true_before = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(2000):
        label.setText("x")
        emitter.flag.emit(True)
    # a few references may come or go for other reasons; the bug took 2,000
    assert abs(sys.getrefcount(None) - none_before) < 100
    assert abs(sys.getrefcount(True) - true_before) < 100
