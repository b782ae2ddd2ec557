"""The Server window (LM Studio style): port, API key, Start/Stop, state, the URL to copy, the request log.

It only drives an AppServer (app/service/app_server.py), which does the serving; closing the window leaves
the server running.
"""

from __future__ import annotations

import asyncio
import logging

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.service.app_server import LOG_LINES, AppServer, ServerError
from app.ui.tasks import spawn

log = logging.getLogger(__name__)


class ServerPanel(QDialog):
    """Start and stop the local OpenAI-compatible server that serves the model the chats use."""

    def __init__(self, server: AppServer, parent: QWidget | None = None):
        super().__init__(parent)
        self.server = server
        self.setWindowTitle("Local server")
        self.setModal(False)
        self._task: asyncio.Task | None = None
        self._doing = ""  # "Starting…" or "Stopping…" while that runs

        self.port_box = QSpinBox()
        self.port_box.setRange(0, 65535)
        self.port_box.setSpecialValueText("any free port")  # shown for 0
        self.port_box.setValue(server.port)
        self.key_field = QLineEdit(server.api_key() or "")
        self.key_field.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_field.setPlaceholderText("none: any program on this machine may use it")
        self.key_note = QLabel(server.key_note)
        self.key_note.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Port", self.port_box)
        form.addRow("API key", self.key_field)
        form.addRow("", self.key_note)

        self.start_button = QPushButton("Start")
        self.stop_button = QPushButton("Stop")
        self.start_button.clicked.connect(self._start)
        self.stop_button.clicked.connect(self._stop)
        self.state_label = QLabel()
        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.state_label, 1)

        self.url_field = QLineEdit()
        self.url_field.setReadOnly(True)
        self.copy_button = QPushButton("Copy")
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.url_field.text()))
        url_row = QHBoxLayout()
        url_row.addWidget(QLabel("URL"))
        url_row.addWidget(self.url_field, 1)
        url_row.addWidget(self.copy_button)

        self.message = QLabel()  # why a start failed
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.log_list = QListWidget()
        for record in list(server.requests):
            self.log_list.addItem(record.line())

        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addLayout(url_row)
        layout.addWidget(self.message)
        layout.addWidget(QLabel("Requests"))
        layout.addWidget(self.log_list, 1)
        self.resize(560, 420)

        server.state_changed.connect(self._show_state)
        server.request_logged.connect(self._add_line)
        server.service.model_loaded.connect(self._show_state)
        self._show_state()

    # --- actions -------------------------------------------------------------------------------------------

    def _start(self) -> None:
        self._run(self._started(), "Starting…")

    def _stop(self) -> None:
        self._run(self.server.stop(), "Stopping…")

    def _run(self, coro, doing: str) -> None:
        if self._task is not None and not self._task.done():
            coro.close()
            return  # a start or stop is under way
        self._doing = doing
        self.message.clear()
        self._task = spawn(coro, name=f"server-{doing}")
        self._task.add_done_callback(lambda _: self._show_state())
        self._show_state()

    async def _started(self) -> None:
        try:
            await self.server.start(self.port_box.value(), self.key_field.text().strip() or None)
        except (ServerError, ValueError) as e:
            self.message.setText(str(e))
        self.key_note.setText(self.server.key_note)

    # --- what it shows -------------------------------------------------------------------------------------

    def _show_state(self, *_: object) -> None:
        busy = self._task is not None and not self._task.done()
        running = self.server.is_running
        self.start_button.setEnabled(not running and not busy)
        self.stop_button.setEnabled(running and not busy)
        self.port_box.setEnabled(not running)
        self.key_field.setEnabled(not running)
        self.url_field.setText(self.server.url or "")
        self.copy_button.setEnabled(running)
        if running:
            model = self.server.model_id
            self.state_label.setText(f"Running · {model}" if model else "Running · no model loaded (requests get 503)")
        else:
            self.state_label.setText(self._doing if busy else "Stopped")

    def _add_line(self, line: str) -> None:
        self.log_list.addItem(line)
        while self.log_list.count() > LOG_LINES:
            self.log_list.takeItem(0)
        self.log_list.scrollToBottom()
