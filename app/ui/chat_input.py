"""The message box: Enter sends, Shift+Enter breaks the line, pasted or dropped images become attachments."""

from __future__ import annotations

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QImage, QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget


class ChatInput(QPlainTextEdit):
    """A plain-text editor for the next message.

    Images pasted or dropped here (image data or local files) are not inserted as text: they come out as
    `image_pasted(QImage)` and `files_dropped(list[str])` for the attachment strip.
    """

    send_requested = Signal()
    image_pasted = Signal(QImage)
    files_dropped = Signal(list)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line; paste or drop images)")
        self.setTabChangesFocus(True)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt's name)
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")  # a real newline, not Qt's soft line separator
            else:
                self.send_requested.emit()
            event.accept()
            return
        super().keyPressEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802
        return source.hasImage() or _local_files(source) != [] or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802
        files = _local_files(source)
        if files:
            self.files_dropped.emit(files)
        elif source.hasImage():
            self.image_pasted.emit(QImage(source.imageData()))
        else:
            super().insertFromMimeData(source)


def _local_files(source: QMimeData) -> list[str]:
    if not source.hasUrls():
        return []
    return [url.toLocalFile() for url in source.urls() if url.isLocalFile()]
