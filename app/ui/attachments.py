"""Image attachments in the window: the strip of thumbnails before sending, and checking picked, dropped or
pasted images off the GUI thread.

The checks themselves are the service's (`app.service.image_files`: the engine's decoder and size limit, the
window's file-size cap and formats); they run through `app.service.workers`, the app's one way off the GUI
thread.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.service.image_files import (
    THUMBNAIL_SIZE,
    AttachmentError,
    ImageAttachment,
    check_image_bytes,
    check_pixels,
    load_image_file,
)
from app.service.workers import FILES, in_worker

__all__ = ["AttachmentError", "AttachmentStrip", "ImageAttachment", "load_image_file_async", "load_qimage_async"]

log = logging.getLogger(__name__)

IMAGE_FILE_FILTER = "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp)"


def qimage_to_png(image: QImage) -> bytes:
    """PNG bytes of a QImage (a pasted clipboard image); safe on a worker thread."""
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(buffer.data())


async def load_image_file_async(path: str | Path) -> ImageAttachment:
    """`load_image_file` on a worker thread, so decoding a big photo never stalls the window."""
    return await in_worker(load_image_file, path, pool=FILES)


async def load_qimage_async(image: QImage, name: str = "pasted image") -> ImageAttachment:
    """Check a pasted QImage (converted to PNG on a worker thread)."""
    if image.isNull():
        raise AttachmentError("The clipboard image is empty or unreadable; copy the image again.")
    check_pixels(name, image.width(), image.height())
    copy = image.copy()  # the clipboard may change while the worker runs
    data = await in_worker(qimage_to_png, copy, pool=FILES)
    return await in_worker(check_image_bytes, data, name, pool=FILES)


def thumbnail_pixmap(png_or_image: bytes, size: int = THUMBNAIL_SIZE) -> QPixmap:
    """A pixmap no larger than `size` pixels each way, from encoded image bytes."""
    pixmap = QPixmap()
    pixmap.loadFromData(QByteArray(png_or_image))
    if pixmap.isNull():
        return pixmap
    return pixmap.scaled(
        QSize(size, size), Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation
    )


class _Thumb(QWidget):
    remove_clicked = Signal()

    def __init__(self, attachment: ImageAttachment, parent: QWidget | None = None):
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)  # the ✕ stays by its image
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.setSpacing(0)
        top = QHBoxLayout()
        top.addStretch()
        remove = QToolButton(text="✕")
        remove.setToolTip(f"Remove {attachment.name}")
        remove.setAutoRaise(True)
        remove.clicked.connect(self.remove_clicked)
        self.remove_button = remove
        top.addWidget(remove)
        layout.addLayout(top)
        image = QLabel()
        image.setPixmap(thumbnail_pixmap(attachment.thumbnail_png))
        image.setToolTip(f"{attachment.name} — {attachment.width}x{attachment.height}")
        layout.addWidget(image)


class AttachmentStrip(QWidget):
    """Thumbnails of the images that go with the next message; each removable. Hidden when empty."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._items: list[tuple[ImageAttachment, _Thumb]] = []
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addStretch()
        self.setVisible(False)

    def add(self, attachment: ImageAttachment) -> None:
        thumb = _Thumb(attachment, self)
        thumb.remove_clicked.connect(lambda t=thumb: self._remove(t))
        self._layout.insertWidget(len(self._items), thumb)
        self._items.append((attachment, thumb))
        self.setVisible(True)
        self.changed.emit()

    def attachments(self) -> list[ImageAttachment]:
        return [a for a, _ in self._items]

    def remove_at(self, index: int) -> None:
        self._remove(self._items[index][1])

    def clear(self) -> None:
        for _, thumb in self._items:
            thumb.deleteLater()
        self._items.clear()
        self.setVisible(False)
        self.changed.emit()

    def _remove(self, thumb: _Thumb) -> None:
        self._items = [(a, t) for a, t in self._items if t is not thumb]
        thumb.deleteLater()
        self.setVisible(bool(self._items))
        self.changed.emit()
