"""Image attachments: checking files (off the GUI thread) and the strip of thumbnails before sending.

The check is the engine's, `engine.vision.image.decode_image`, with its one size limit, so what attaches is
what the model can read; the window adds only its own file-size cap and the formats it shows. Every check
raises `AttachmentError` whose message names the file and says what to do; the chat tab shows it and keeps
going.
"""

from __future__ import annotations

import asyncio
import io
import logging
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from engine.errors import ImageError
from engine.vision.image import check_size, decode_image

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 32 * 1024 * 1024
THUMBNAIL_SIZE = 96
# The formats the window attaches (and shows again from the store with Qt), by Pillow's name -> file suffix.
_FORMATS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp"}
IMAGE_FILE_FILTER = "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp)"


class AttachmentError(ImageError):
    """A file that cannot be attached: not an image, corrupt, truncated, too big, or of a format not attached."""


@dataclass(frozen=True)
class ImageAttachment:
    """A checked image waiting to be sent: its original bytes, file suffix, size and a small PNG thumbnail."""

    name: str
    data: bytes
    suffix: str
    width: int
    height: int
    thumbnail_png: bytes


def check_image_bytes(data: bytes, name: str) -> ImageAttachment:
    """Check that `data` is a whole, readable image of a supported format and sensible size.

    Slow for big images (decodes every pixel, which is what finds a truncated file): call it from a worker
    thread (`load_image_file_async`).
    """
    if len(data) > MAX_FILE_BYTES:
        raise AttachmentError(
            f"{name} is {len(data) / 2**20:.0f} MB; Tandem attaches images up to {MAX_FILE_BYTES // 2**20} MB. "
            "Save a smaller copy and attach that."
        )
    try:
        image = decode_image(data, name=name)
    except ImageError as e:
        raise AttachmentError(str(e)) from e
    kind = image.format or ""
    if kind not in _FORMATS:
        raise AttachmentError(f"{name} is a {kind or 'unknown'} image; Tandem attaches PNG, JPEG, WebP, GIF and BMP.")
    thumb = image.picture.copy()
    thumb.thumbnail((THUMBNAIL_SIZE * 2, THUMBNAIL_SIZE * 2))
    out = io.BytesIO()
    thumb.save(out, "PNG")
    width, height = image.picture.size
    return ImageAttachment(name, data, _FORMATS[kind], width, height, out.getvalue())


def load_image_file(path: str | Path) -> ImageAttachment:
    """Read and check an image file (`AttachmentError` for anything that cannot be attached)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise AttachmentError(
                f"{path.name} is {size / 2**20:.0f} MB; Tandem attaches images up to "
                f"{MAX_FILE_BYTES // 2**20} MB. Save a smaller copy and attach that."
            )
        data = path.read_bytes()
    except AttachmentError:
        raise
    except OSError as e:
        raise AttachmentError(f"Cannot read {path}: {e.strerror or e}.") from e
    return check_image_bytes(data, path.name)


def qimage_to_png(image: QImage) -> bytes:
    """PNG bytes of a QImage (a pasted clipboard image); safe on a worker thread."""
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(buffer.data())


async def load_image_file_async(path: str | Path) -> ImageAttachment:
    """`load_image_file` on a worker thread, so decoding a big photo never stalls the window."""
    return await asyncio.get_running_loop().run_in_executor(None, load_image_file, path)


async def load_qimage_async(image: QImage, name: str = "pasted image") -> ImageAttachment:
    """Check a pasted QImage (converted to PNG on a worker thread)."""
    if image.isNull():
        raise AttachmentError("The clipboard image is empty or unreadable; copy the image again.")
    try:
        check_size(name, image.width(), image.height())
    except ImageError as e:
        raise AttachmentError(str(e)) from e
    copy = image.copy()  # the clipboard may change while the worker runs
    loop = asyncio.get_running_loop()
    data = await loop.run_in_executor(None, qimage_to_png, copy)
    return await loop.run_in_executor(None, check_image_bytes, data, name)


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
