"""The model manager's download form: a Hugging Face repo id -> a folder in the models folder.

The download runs on a loader worker (app.service.workers, a daemon thread: quitting mid-download does not
wait) and reports back through queued Qt signals, so the window stays responsive while huggingface_hub works.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.service.catalog import download_from_hub, models_dir
from app.service.workers import LOADER, submit
from app.ui.theme import mark

log = logging.getLogger(__name__)

PROGRESS_STEPS = 1000  # QProgressBar takes ints: fractions are shown in tenths of a percent
HINT = "Needs an internet connection; the model is saved with your other models."


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


class WrappedLabel(QLabel):
    """A word-wrapped label that asks its layout for all its lines. Qt's box layouts size a wrapped label by
    its one-line minimum, so a long message (the offline Hugging Face error runs to five lines) was cut off and
    overlapped the widgets above it."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(text, parent)
        self.setWordWrap(True)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        super().setText(text)
        self._fit()

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        height = self.heightForWidth(max(self.width(), 1))
        if height > 0 and height != self.minimumHeight():
            self.setMinimumHeight(height)


class DownloadBox(QGroupBox):
    """A repo id field, a Download button, progress and a message; `finished(repo_id, folder)` or
    `failed(message)` when a download ends."""

    finished = Signal(str, str)  # repo id, folder of the downloaded model
    failed = Signal(str)  # the message shown

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Download from Hugging Face", parent)
        self._download: Future[Path] | None = None  # the download running
        self.repo_edit = QLineEdit()
        self.repo_edit.setPlaceholderText("repo id, e.g. HuggingFaceTB/SmolLM2-135M-Instruct")
        self.repo_edit.returnPressed.connect(lambda: self.download(self.repo_edit.text()))
        self.button = QPushButton("Download")
        self.button.clicked.connect(lambda: self.download(self.repo_edit.text()))
        self.progress = QProgressBar()
        self.progress.setRange(0, PROGRESS_STEPS)
        self.progress.hide()
        self.label = WrappedLabel(HINT)
        row = QHBoxLayout()
        row.addWidget(self.repo_edit, 1)
        row.addWidget(self.button)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.progress)
        layout.addWidget(self.label)
        self._bridge = _DownloadBridge(self)
        # Queued even when emitted on the GUI thread: a download that fails before its done-callback is added
        # (offline, in milliseconds) runs that callback inside download(), which must return first.
        queued = Qt.ConnectionType.QueuedConnection
        self._bridge.progress.connect(self._on_progress, queued)
        self._bridge.finished.connect(self._on_finished, queued)
        self._bridge.failed.connect(self._on_failed, queued)

    def is_downloading(self) -> bool:
        return self._download is not None and not self._download.done()

    def download(self, repo_id: str) -> None:
        """Download a Hugging Face repo into the models folder on a loader worker."""
        repo_id = repo_id.strip()
        if not repo_id:
            self._set_message("Write the model's repo id first, as owner/name.", error=True)
            return
        if self.is_downloading():
            self._set_message("A download is already running; wait for it to finish.", error=True)
            return
        dest = models_dir()  # download_from_hub adds the <owner>--<name> folder itself
        self.button.setEnabled(False)
        self.progress.setValue(0)
        self.progress.show()
        self._set_message(f"Downloading {repo_id}…")
        bridge = self._bridge

        def done(future: Future[Path]) -> None:  # on the download's thread: the bridge carries it to the GUI
            error = future.exception()
            if error is not None:  # every failure becomes a message in the window; the app keeps running
                log.info("download of %s failed: %s", repo_id, error)
                _emit(bridge.failed, repo_id, str(error) or type(error).__name__)
            else:
                _emit(bridge.finished, repo_id, str(future.result()))

        self._download = submit(download_from_hub, repo_id, dest, lambda f: _emit(bridge.progress, f), pool=LOADER)
        self._download.add_done_callback(done)

    def _on_progress(self, fraction: float) -> None:
        self.progress.setValue(round(max(0.0, min(1.0, fraction)) * PROGRESS_STEPS))

    def _on_finished(self, repo_id: str, folder: str) -> None:
        self.button.setEnabled(True)
        self.progress.hide()
        self._set_message(f"Downloaded {repo_id} to {folder}.")
        self.finished.emit(repo_id, folder)

    def _on_failed(self, repo_id: str, message: str) -> None:
        self.button.setEnabled(True)
        self.progress.hide()
        self._set_message(message, error=True)
        self.failed.emit(message)

    def clear_error(self) -> None:
        """Put the hint back in place of a failed download's message (another model has loaded since)."""
        if self.label.property("error") and not self.is_downloading():
            self._set_message(HINT)

    def _set_message(self, text: str, error: bool = False) -> None:
        self.label.setText(text)
        mark(self.label, "error" if error else None)
