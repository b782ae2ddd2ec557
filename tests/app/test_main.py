"""The `tandem` entry point opens a window (offscreen)."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMainWindow


def test_main_opens_a_titled_window(qapp):
    from app.main import main

    seen = []

    def check():
        seen.extend(
            w.windowTitle() for w in QApplication.topLevelWidgets() if isinstance(w, QMainWindow) and w.isVisible()
        )
        QApplication.quit()

    QTimer.singleShot(50, check)
    assert main([]) == 0
    assert "Tandem" in seen
