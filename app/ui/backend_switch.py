"""Which backend the chats and the compare view answer with: the local engine, or a remote server.

The window holds one BackendSwitch. New tabs are built with `current`; `changed` tells the window to hand the
new backend to every open tab and the compare view (their `set_backend`). Loading a local model switches back
to the local engine, as a user expects who picks a model in the model manager.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from app.service.remote import RemoteBackend
from app.service.remote_endpoints import describe


class BackendSwitch(QObject):
    changed = Signal()

    def __init__(self, local: Any, parent: QObject | None = None):
        super().__init__(parent)
        self.local = local
        self.current: Any = local

    @property
    def remote(self) -> RemoteBackend | None:
        return self.current if isinstance(self.current, RemoteBackend) else None

    def use_local(self) -> None:
        if self.current is not self.local:
            self.current = self.local
            self.changed.emit()

    def use_remote(self, backend: RemoteBackend) -> None:
        self.current = backend
        self.changed.emit()

    def status_line(self) -> str | None:
        """The status bar's model line for a remote backend (None: the local engine says its own)."""
        remote = self.remote
        return f"Remote: {describe(remote)}" if remote is not None else None
