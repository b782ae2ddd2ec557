"""The window's model side (a MainWindow mixin): opening a model, the model manager, compare, server and
shortcut windows, loading progress in the status bar, and which backend answers (local or remote)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog

from app.ui.model_card import kv_format_name
from app.ui.model_loading import load_choice
from app.ui.server_panel import ServerPanel
from app.ui.shortcuts_dialog import ShortcutsDialog


class ModelSide:
    """Mixed into MainWindow: its service, backends, labels, tabs and the windows it opens."""

    def ask_open_model(self) -> None:
        dialog = QFileDialog(self, "Open a .gguf file or a model folder")
        dialog.setNameFilter("Models (*.gguf config.json)")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)

        def chosen(path: str) -> None:
            # a Hugging Face model is a folder: picking its config.json means the folder
            target = Path(path).parent if Path(path).name == "config.json" else Path(path)
            context, kv_format = load_choice(self.store, self.service, str(target))  # the model manager's choice
            self.service.load_model(target, None, context, kv_format)

        dialog.fileSelected.connect(chosen)
        dialog.open()

    def show_model_manager(self) -> None:
        if self._model_manager is None:
            from app.ui.model_manager import ModelManager

            self._model_manager = ModelManager(self.store, self.service, self)
        self._model_manager.show()
        self._model_manager.raise_()

    def show_compare_view(self) -> None:
        if self._compare_view is None:
            from app.ui.compare_view import CompareView

            self._compare_view = CompareView(self.store, self.backends.current, self)
            self._compare_view.setWindowFlag(Qt.WindowType.Window)
            self._compare_view.setWindowTitle("Compare — Tandem")
            self._compare_view.resize(_fitted(self, self._compare_view.columns_width(), 700))
            self._compare_view.addAction(self.compare_run_action)
            self._compare_view.addAction(self.compare_close_action)
        self._compare_view.show()
        self._compare_view.raise_()

    def show_shortcuts(self) -> ShortcutsDialog:
        """Help -> Keyboard shortcuts, listed from this window's actions as they are now."""
        dialog = ShortcutsDialog(self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    def show_server_panel(self) -> ServerPanel:
        if self._server_panel is None:
            self._server_panel = ServerPanel(self.app_server, self)
        self._server_panel.show()
        self._server_panel.raise_()
        return self._server_panel

    def _loading_started(self, name: str) -> None:
        self.model_label.setText(f"Loading {name}…")
        self.load_progress.setValue(0)
        self.load_progress.setVisible(True)
        self.error_label.clear()

    def _loading_progress(self, fraction: float) -> None:
        self.load_progress.setValue(int(fraction * 1000))

    def _model_loaded(self, name: str) -> None:
        self.backends.use_local()  # a model chosen here is what the user wants to chat with
        self.model_label.setText(local_status(self.service))
        self.load_progress.setVisible(False)
        for tab in self.chat_tabs():
            tab.refresh_context_meter()
        self._send_pending()

    def _backend_changed(self) -> None:
        backend = self.backends.current
        for tab in self.chat_tabs():
            tab.set_backend(backend)
        if self._compare_view is not None:
            self._compare_view.set_backend(backend)
        remote = self.backends.status_line()
        if remote is not None:
            self.model_label.setText(remote)
            self.error_label.clear()
        elif self.service.is_loaded:
            self.model_label.setText(local_status(self.service))
        self._send_pending()

    def _send_pending(self) -> None:
        if self._pending_prompt is not None and self.backends.current.is_loaded:
            prompt, self._pending_prompt = self._pending_prompt, None
            self.send_prompt(prompt)

    def _load_failed(self, message: str) -> None:
        self.load_progress.setVisible(False)
        local = f"Model: {self.service.model_name}" if self.service.is_loaded else "No model"
        self.model_label.setText(self.backends.status_line() or local)
        self.show_error(message)


def local_status(service) -> str:
    """The status bar's line for the local model: "Model: name · context 32768 tokens · Q8 cache"."""
    kv_format = service.kv_format
    cache = "full-precision" if kv_format in (None, "bf16") else kv_format_name(kv_format)
    return f"Model: {service.model_name} · context {service.context_length} tokens · {cache} cache"


def _fitted(window: Any, width: int, height: int) -> QSize:
    """`width` x `height`, made smaller where the screen the window is on has less room (a laptop's 1366 x 768,
    say), so a new window opens whole on it."""
    screen = window.screen() or QGuiApplication.primaryScreen()
    room = screen.availableGeometry() if screen is not None else None
    if room is None or room.isEmpty():
        return QSize(width, height)
    return QSize(min(width, room.width()), min(height, room.height()))
