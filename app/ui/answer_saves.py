"""Answer saves the store refused (a full disk, a file another program locked): kept and retried until they land.

A chat tab writes its streaming answer through `PendingSaves.save`. When the store raises `StoreError`, the
fields stay here (later fields for the same message replace earlier ones), `failed` tells the tab, and a
timer tries again every `retry_ms`; the tab also calls `retry()` on the user's next action. When everything
is written, `saved` tells the tab. Before, a failed final save raised out of the answer's task: the answer
stayed `complete=0` in the database and `tandem --quit-after-answer` waited forever.
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.store import StoreError

log = logging.getLogger(__name__)

RETRY_INTERVAL_MS = 3000


class PendingSaves(QObject):
    """Message updates (`store.update_message` fields by message id) not yet in the database."""

    failed = Signal(str)  # the store's message, at every failed attempt
    saved = Signal()  # everything that had failed is written now

    def __init__(self, store: Any, parent: QObject | None = None, retry_ms: int = RETRY_INTERVAL_MS):
        super().__init__(parent)
        self.store = store
        self._pending: dict[int, dict[str, Any]] = {}
        self._problem: str | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(retry_ms)
        self._timer.timeout.connect(self.retry)

    @property
    def problem(self) -> str | None:
        """Why the unsaved updates could not be written (None when nothing is waiting)."""
        return self._problem

    @property
    def retry_interval_ms(self) -> int:
        return self._timer.interval()

    def is_pending(self, message_id: int) -> bool:
        return message_id in self._pending

    def save(self, message_id: int, **fields: Any) -> bool:
        """Write `fields` to the message (with any still unsaved); False when kept for a later try."""
        self._pending.setdefault(message_id, {}).update(fields)
        return self.retry()

    def retry(self) -> bool:
        """Try every unsaved update again, oldest message first; True when nothing is left unsaved."""
        for message_id in list(self._pending):
            try:
                self.store.update_message(message_id, **self._pending[message_id])
            except KeyError:  # the chat or the message was deleted meanwhile: nothing left to save
                log.info("answer %s no longer exists; its unsaved text is dropped", message_id)
            except StoreError as e:
                level = logging.INFO if str(e) == self._problem else logging.WARNING  # once, not every retry
                self._problem = str(e)
                log.log(
                    level, "could not save answer %s (retrying every %d ms): %s", message_id, self.retry_interval_ms, e
                )
                if not self._timer.isActive():
                    self._timer.start()
                self.failed.emit(self._problem)
                return False
            del self._pending[message_id]
        self._timer.stop()
        if self._problem is not None:
            self._problem = None
            log.info("the unsaved answers are saved now")
            self.saved.emit()
        return True
