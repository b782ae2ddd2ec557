"""The model manager: the starter model, the bundled demo vision model, models the user added, and a
download-by-repo-id form.

Loading runs in the service's loader thread; this dialog only starts it and listens to the service's
signals (progress, loaded, failed). The download form (app/ui/download_box.py) runs on a loader worker;
a finished download is added to the list and loaded. The speculation setting lives in
app/ui/speculation_box.py.

The selected model's card (app/ui/model_card.py) shows what it is and the memory it needs at the chosen
context and KV cache format (both saved in the store; the context, until one is chosen, the largest that fits).
A load the service refuses for memory offers the longest context that fits; the model already loaded is not
loaded again.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.service.catalog import (
    DEMO_VISION_NAME,
    STARTER_NAME,
    demo_vision_path,
    model_display_name,
    model_info,
    starter_path,
    supported_architectures,
    vision_architectures,
)
from app.service.remote_endpoints import saved_endpoint
from app.service.speculation import Speculation, load_speculation
from app.ui.download_box import PROGRESS_STEPS, DownloadBox
from app.ui.model_card import ModelCard
from app.ui.model_list import DEMO_KIND, KIND_ROLE, PATH_ROLE, STARTER_KIND, ModelList, same_path
from app.ui.model_loading import (
    CONTEXT_SETTING,
    KV_FORMAT_SETTING,
    LoadProgress,
    chosen_context,
    kv_format_setting,
    load_choice,
)
from app.ui.remote_dialog import ask_remote
from app.ui.speculation_box import SpeculationBox
from app.ui.theme import mark

log = logging.getLogger(__name__)


def _is_projector(path: Path) -> bool:
    """Whether a .gguf file is llama.cpp's multimodal projector ("clip" architecture) rather than a model."""
    try:
        return model_info(path).architecture == "clip"
    except Exception:  # unreadable: loading it names what is wrong
        return False


# How users know the families the config.json class names stand for; a class not listed reads as its stem.
_FAMILY_NAMES = {
    "Gemma3": "Gemma 3",
    "Llama": "Llama",
    "Llava": "LLaVA",
    "Mistral": "Mistral",
    "Mistral3": "Mistral Small 3.1",
    "Qwen2_5_VL": "Qwen2.5-VL",
    "Qwen2VL": "Qwen2-VL",
    "Idefics3": "Idefics3",
    "SmolVLM": "SmolVLM",
}


def family_name(architecture: str) -> str:
    """The family a config.json architecture belongs to: "Gemma3ForCausalLM" -> "Gemma 3"."""
    stem = re.sub(r"For(CausalLM|ConditionalGeneration)$", "", architecture)
    return _FAMILY_NAMES.get(stem, stem)


def supported_text() -> str:
    """The model families the engine runs, text and vision, for the dialog's help line."""
    vision = set(vision_architectures())
    text = dict.fromkeys(family_name(a) for a in supported_architectures() if a not in vision)
    seeing = dict.fromkeys(family_name(a) for a in sorted(vision))
    return f"Runs text models: {', '.join(text)}.\nRuns vision models: {', '.join(seeing)}."


class ModelManager(LoadProgress, QDialog):
    """Lists the starter, the bundled demo vision model and the user's models, adds local ones, downloads
    from the hub, and loads one.

    Public methods are what the buttons call, so the main window and tests can drive them directly:
    `add_model(path)`, `remove_model(path)`, `load(path)`, `load_selected()`, `download(repo_id)`,
    `set_speculation(speculation)`.
    """

    model_added = Signal(str)  # path
    download_finished = Signal(str)  # folder of the downloaded model
    download_failed = Signal(str)  # message shown to the user

    def __init__(self, store, service, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self.service = service
        self._pending: tuple[str, str] | None = None  # (path, name) of the load in flight
        self._fit_offer: tuple[str, int] | None = None  # (path, context) that fits, after a memory refusal
        self.setWindowTitle("Models")
        self.resize(920, 780)

        self.model_list = ModelList()
        self.model_list.itemDoubleClicked.connect(self._on_double_click)
        self.model_list.currentItemChanged.connect(lambda *_: self._selection_changed())
        self.card = ModelCard(service)
        # 0 from the card is "the largest that fits": saved as no context chosen
        self.card.context_edited.connect(lambda tokens: self.store.set_setting(CONTEXT_SETTING, tokens or None))
        self.card.kv_format_edited.connect(lambda kv_format: self.store.set_setting(KV_FORMAT_SETTING, kv_format))

        self.add_folder_button = QPushButton("Add folder…")
        self.add_gguf_button = QPushButton("Add .gguf file…")
        self.remove_button = QPushButton("Remove")
        self.remote_button = QPushButton("Use a remote server…")
        self.remote_button.setToolTip(
            "Chat through a model on another machine: a vLLM, llama.cpp (llama-server) or Tandem server"
        )
        self.remote_button.clicked.connect(self._use_remote)
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.add_folder_button.clicked.connect(self._choose_folder)
        self.add_gguf_button.clicked.connect(self._choose_gguf)
        self.remove_button.clicked.connect(self._remove_selected)
        self.load_button.clicked.connect(self.load_selected)
        buttons = QHBoxLayout()
        for b in (self.add_folder_button, self.add_gguf_button, self.remove_button, self.remote_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.load_button)

        self.status_label = QLabel()
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, PROGRESS_STEPS)
        self.progress_bar.setTextVisible(True)
        self.progress_bar.hide()
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        mark(self.error_label, "error")  # colours come from the sheet (app/ui/theme.py), light or dark
        self.error_label.hide()
        self.fit_button = QPushButton()
        self.fit_button.clicked.connect(self._load_offered_context)
        self.fit_button.hide()

        # The content scrolls rather than squeezing: a long message (the offline Hugging Face error is five lines)
        # would otherwise clip the text around it in a dialog as tall as the screen.
        content = QWidget()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        layout = QVBoxLayout(content)
        layout.addWidget(QLabel("Models on this computer (double-click to load):"))
        models = QHBoxLayout()
        models.addWidget(self.model_list, 3)
        models.addWidget(self.card, 2)
        layout.addLayout(models, 1)
        self.supported_label = QLabel(supported_text())
        self.supported_label.setWordWrap(True)
        mark(self.supported_label, "muted")
        layout.addWidget(self.supported_label)
        layout.addLayout(buttons)
        layout.addWidget(self.status_label)
        layout.addWidget(self.progress_bar)
        layout.addWidget(self.error_label)
        fit_row = QHBoxLayout()
        fit_row.addWidget(self.fit_button)
        fit_row.addStretch(1)
        layout.addLayout(fit_row)
        self.speculation_box = SpeculationBox(store, service, self)
        # The boxes' widgets, by the names the dialog has always given them.
        self.speculation_combo = self.speculation_box.combo
        self.draft_layers_spin = self.speculation_box.layers_spin
        self.speculation_label = self.speculation_box.label
        layout.addWidget(self.speculation_box)
        self.download_box = DownloadBox(self)
        self.repo_edit = self.download_box.repo_edit
        self.download_button = self.download_box.button
        self.download_progress = self.download_box.progress
        self.download_label = self.download_box.label
        self.download_box.finished.connect(self._on_download_finished)
        self.download_box.failed.connect(self.download_failed)
        layout.addWidget(self.download_box)

        service.loading_started.connect(self._on_loading_started)
        service.loading_progress.connect(self._on_loading_progress)
        service.model_loaded.connect(self._on_model_loaded)
        service.load_failed.connect(self._on_load_failed)
        service.memory_refused.connect(self._on_memory_refused)
        self.refresh()
        if service.is_loaded:
            self.status_label.setText(f"Loaded: {service.model_name}")
        saved = load_speculation(store)
        if saved != service.speculation:  # the service was made without the saved setting: use it now
            self.set_speculation(saved)

    # --- the list ------------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Rebuild the list (the starter, the demo vision model, the remembered models) and the card."""
        self.model_list.refresh(self.store, self.service.model_path)
        self._selection_changed()

    def paths(self) -> list[str]:
        """The paths listed, starter first."""
        return self.model_list.paths()

    def selected_path(self) -> str | None:
        return self.model_list.selected_path()

    def select_path(self, path: str | Path | None) -> bool:
        return self.model_list.select_path(path)

    def _selection_changed(self) -> None:
        self._update_buttons()
        self._show_card()

    def _show_card(self) -> None:
        """Fill the card for the selected model (its headers only; a file that cannot be read says why)."""
        path = self.selected_path()
        if path is None:
            self.card.show_model(None)
            return
        try:
            info = model_info(path)
        except Exception as e:  # shown on the card; the list row already says it cannot be read
            self.card.show_model(None, note=str(e))
            return
        note = "" if Path(path).exists() else "Downloaded when you load it."
        self.card.show_model(info, chosen_context(self.store, self.service, path), note, kv_format_setting(self.store))

    def _update_buttons(self) -> None:
        item = self.model_list.currentItem()
        self.load_button.setEnabled(item is not None)
        self.remove_button.setEnabled(item is not None and item.data(KIND_ROLE) not in (STARTER_KIND, DEMO_KIND))

    # --- adding and removing -----------------------------------------------------------------------------

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face model folder (with config.json)")
        if folder:
            self.add_model(folder)

    def _choose_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model file", "", "GGUF models (*.gguf)")
        if path:
            self.add_model(path)

    def add_model(self, path: str | Path, name: str | None = None, kind: str = "local"):
        """Remember a model folder or .gguf file; returns the store's ModelEntry, or None (error shown)."""
        p = Path(path).expanduser()
        if not p.exists():
            self.show_error(f"{p} does not exist. Choose a model folder or a .gguf file.")
            return None
        if p.is_file() and p.suffix.lower() != ".gguf":
            self.show_error(f"{p} is not a .gguf file. Choose a .gguf file or a Hugging Face model folder.")
            return None
        if p.is_file() and _is_projector(p):
            # Jan once listed a downloaded mmproj as a model of its own; here it belongs with its text file.
            self.show_error(
                f"{p.name} is a vision projector (mmproj), not a model. Add the text .gguf that came with it; "
                "Tandem finds the projector beside it and the model sees images."
            )
            return None
        # Contents are checked when the model loads, where the error can name the exact file at fault.
        entry = self.store.models.add(str(p.resolve()), name or model_display_name(p), kind)
        self.clear_error()
        self.refresh()
        self.select_path(entry.path)
        self.model_added.emit(entry.path)
        return entry

    def _remove_selected(self) -> None:
        path = self.selected_path()
        if path is not None:
            self.remove_model(path)

    def remove_model(self, path: str) -> None:
        """Forget a model (its files stay where they are)."""
        self.store.models.remove(path)
        self.refresh()

    # --- loading -------------------------------------------------------------------------------------------

    def _use_remote(self) -> None:
        """The window's remote-server dialog (its switch covers every tab), over this manager."""
        window = self.parent()
        if hasattr(window, "backends"):
            ask_remote(window, saved_endpoint(self.store))

    def load_selected(self) -> None:
        path = self.selected_path()
        if path is None:
            self.show_error("Select a model in the list first.")
            return
        self.load(path)

    def _on_double_click(self, item: QListWidgetItem) -> None:
        path = item.data(PATH_ROLE)
        if same_path(path, self.service.model_path):  # a double-click is "use this one", never "reload"
            self.clear_error()
            self.status_label.setText(f"{self.service.model_name} is already loaded.")
            return
        self.load(path)

    def load(self, path: str | Path, context_length: int | None = None, kv_format: str | None = None) -> None:
        """Start loading a listed model (the starter is fetched first if absent) with `context_length` tokens
        a chat and a KV cache in `kv_format` (defaults: the card's, fitted to the model); progress shows
        below. The model already loaded so, or already being loaded, is not loaded again."""
        path = str(path)
        context, chosen_format = load_choice(self.store, self.service, path)
        context, kv_format = context_length or context, kv_format or chosen_format
        self.clear_error()
        if self._pending is not None and same_path(self._pending[0], path):
            self.status_label.setText(f"{self._pending[1]} is loading already.")
            return
        if (
            same_path(path, self.service.model_path)
            and context in (self.service.context_request, self.service.context_length)
            and kv_format == self.service.kv_format
        ):
            self.status_label.setText(f"{self.service.model_name} is already loaded.")
            return
        if same_path(path, starter_path()):
            self._pending = (path, STARTER_NAME)
            self.service.fetch_and_load_starter(context, kv_format)
            return
        if same_path(path, demo_vision_path()):
            name = DEMO_VISION_NAME  # bundled: loads from disk, no network
        else:
            name = next((e.name for e in self.store.models.all() if same_path(e.path, path)), None)
        self._pending = (path, name or model_display_name(path))
        self.service.load_model(path, name, context, kv_format)

    # --- speculation ---------------------------------------------------------------------------------------

    def speculation(self) -> Speculation:
        """The speculation the widgets show (the layer count is the service's unless a draft is chosen)."""
        return self.speculation_box.speculation()

    def set_speculation(self, speculation: Speculation) -> asyncio.Task[bool]:
        """Save `speculation`, show it, and have the service use it (returns the service's task)."""
        return self.speculation_box.set_speculation(speculation)

    def show_error(self, message: str) -> None:
        log.info("model manager: %s", message)
        self.error_label.setText(message)
        self.error_label.show()

    def clear_error(self) -> None:
        self.error_label.clear()
        self.error_label.hide()
        self.fit_button.hide()

    # --- downloading ---------------------------------------------------------------------------------------

    def is_downloading(self) -> bool:
        return self.download_box.is_downloading()

    def download(self, repo_id: str) -> None:
        """Download a Hugging Face repo into the models folder on a worker thread, then remember and load it."""
        self.download_box.download(repo_id)

    def _on_download_finished(self, repo_id: str, folder: str) -> None:
        if self.add_model(folder, name=repo_id, kind="hub") is not None:
            self.load(folder)  # the user asked for this model: use it
        self.download_finished.emit(folder)
