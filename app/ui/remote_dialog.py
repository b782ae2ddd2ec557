"""Use a remote server: a dialog for its URL, API key and model, and the window's side of switching to it.

    [ http://gpu-box:8000/v1        ] [List models]
    API key [••••••••]   (where the key will be kept)
    Model   [Qwen2.5-72B-Instruct ▾]   [x] The model sees images
    (what went wrong, or how many models the server lists)
                                   [Cancel] [Use this server]

Listing asks the server (GET /models) on the GUI loop's asyncio side, so the window never blocks; a wrong URL,
a refused key or an HTML page answers in the dialog with what to do. `use_remote` connects, remembers the
endpoint (app.service.remote_endpoints) and switches the window's backend.
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.service.api_keys import NO_KEYRING_NOTE, keyring_available
from app.service.remote_endpoints import Endpoint, connect, save_endpoint
from app.service.remote_errors import RemoteError
from app.ui.tasks import spawn

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8000/v1"


class RemoteDialog(QDialog):
    def __init__(self, parent: QWidget | None = None, endpoint: Endpoint | None = None):
        super().__init__(parent)
        self.setWindowTitle("Use a remote server — Tandem")
        self.url = QLineEdit(endpoint.url if endpoint else DEFAULT_URL)
        self.url.setObjectName("remoteUrl")
        self.url.setPlaceholderText("http://host:port/v1 (vLLM, llama-server, python -m engine serve)")
        self.key = QLineEdit((endpoint.api_key or "") if endpoint else "")
        self.key.setObjectName("remoteKey")
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("none")
        self.list_button = QPushButton("List models")
        self.list_button.setObjectName("listModels")
        self.list_button.clicked.connect(lambda: spawn(self.list_models(), name="list-remote-models"))
        self.models = QComboBox()
        self.models.setObjectName("remoteModel")
        self.models.setEditable(True)  # a server without /models still takes a model id typed in
        if endpoint and endpoint.model:
            self.models.addItem(endpoint.model)
        self.sees_images = QCheckBox("The model sees images (pictures go as data: URLs)")
        self.sees_images.setChecked(bool(endpoint and endpoint.sees_images))
        self.status = QLabel()
        self.status.setObjectName("remoteStatus")
        self.status.setWordWrap(True)
        key_note = QLabel("The key is kept in the system keyring." if keyring_available() else NO_KEYRING_NOTE)
        key_note.setWordWrap(True)
        key_note.setObjectName("keyNote")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Use this server")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

        url_row = QHBoxLayout()
        url_row.addWidget(self.url, 1)
        url_row.addWidget(self.list_button)
        form = QFormLayout()
        form.addRow("Server", url_row)
        form.addRow("API key", self.key)
        form.addRow("", key_note)
        form.addRow("Model", self.models)
        form.addRow("", self.sees_images)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self.resize(560, self.sizeHint().height())

    def endpoint(self) -> Endpoint:
        model = self.models.currentText().strip() or None
        return Endpoint(self.url.text().strip(), self.key.text().strip() or None, model, self.sees_images.isChecked())

    async def list_models(self) -> list[str]:
        """Ask the server for its models and offer them; the status line says how it went."""
        self.list_button.setEnabled(False)
        self.status.setText("Asking the server…")
        try:
            _, models = await connect(Endpoint(self.url.text().strip(), self.key.text().strip() or None))
        except (ValueError, RemoteError) as e:
            self.status.setText(str(e))
            self.status.setProperty("error", True)
            return []
        finally:
            self.list_button.setEnabled(True)
        chosen = self.models.currentText()
        self.models.clear()
        self.models.addItems(models)
        if chosen in models:
            self.models.setCurrentText(chosen)
        self.status.setProperty("error", False)
        self.status.setText(f"The server lists {len(models)} model{'s' if len(models) != 1 else ''}.")
        return models


async def use_remote(window: Any, endpoint: Endpoint, remember: bool = True) -> bool:
    """Connect to `endpoint` and make it the window's backend; False (the reason shown) when that fails."""
    try:
        backend, _ = await connect(endpoint)
    except (ValueError, RemoteError) as e:
        window.show_error(f"Could not use the server: {e}")
        return False
    window.backends.use_remote(backend)
    if remember:
        place = save_endpoint(window.store, endpoint)
        if place.note:  # after the switch, which clears the status bar's last error
            window.show_error(place.note)
    return True


def ask_remote(window: Any, endpoint: Endpoint | None = None) -> RemoteDialog:
    """Model -> Use a remote server…: the dialog, and on "Use this server" the switch."""
    dialog = RemoteDialog(window, endpoint)
    dialog.accepted.connect(lambda: spawn(use_remote(window, dialog.endpoint()), name="use-remote"))
    dialog.open()
    return dialog
