"""Python's garbage collector runs on the GUI thread only.

The collector frees reference cycles in whichever thread happens to allocate when a threshold is crossed:
the engine thread, a prompt worker, an image loader. A Qt object caught in such a cycle (a widget, its
QTimers) is then destroyed on that thread, and Qt's timer list, which belongs to the GUI thread, is changed
from another one; the next timer the event loop fires can then point at freed memory. The suite crashed so
(SIGSEGV in QCoreApplication::notifyInternal2 under QTimerInfoList::activateTimers, under gdb) once the chat
tab built prompts on worker threads. So automatic collection is switched off and the GUI thread collects
itself, from a timer, each generation when its count passes the threshold Python would have used.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 500


class GuiThreadCollector(QObject):
    def __init__(self, parent: QObject | None = None, interval_ms: int = INTERVAL_MS):
        super().__init__(parent)
        self._thresholds = gc.get_threshold()
        self._was_enabled = gc.isenabled()  # a second collector (tests run main() in one process) restores it
        gc.disable()
        # What lives now (the imported modules: torch's, Qt's, the app's, about 200k objects) lives as long as the
        # process, and every full collection would walk it: a stalled window each time generation 2 came due
        # while answers stream. Frozen (after collecting what is already garbage), a full collection walks only
        # what came later. stop() thaws them, so the interpreter's exit frees them (nanobind reports the instances
        # it finds unfreed as leaks).
        gc.collect()
        gc.freeze()
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.collect)
        self._timer.start(interval_ms)

    def collect(self) -> None:
        """Collect the generations whose counts passed their thresholds (oldest first, which covers younger)."""
        counts = gc.get_count()
        for generation in (2, 1, 0):
            if counts[generation] > self._thresholds[generation]:
                gc.collect(generation)
                return

    def stop(self) -> None:
        self._timer.stop()
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()
