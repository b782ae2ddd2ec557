"""Attachments in the window: the strip of image thumbnails and document chips before sending, and checking
picked, dropped or pasted files off the GUI thread.

The checks themselves are the service's (`app.service.image_files`: the engine's decoder and size limit, the
window's file-size cap and formats) and the documents' (`app.documents.attach`: text read, counted with the
model's tokenizer and cut into passages); they run through `app.service.workers`, the app's one way off the GUI
thread. A file goes by its name: .txt, .md, .pdf and .docx are documents, anything else is tried as an image.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.documents.attach import AttachedDocument, prepare_document, summary, token_counter
from app.documents.extract import SUFFIXES, DocumentError, document_kind, unknown_kind_error
from app.service.image_files import (
    FORMATS,
    THUMBNAIL_SIZE,
    AttachmentError,
    ImageAttachment,
    check_image_bytes,
    check_pixels,
    load_image_file,
)
from app.service.workers import FILES, in_worker

__all__ = [
    "AttachedDocument",
    "AttachmentError",
    "AttachmentStrip",
    "DocumentError",
    "ImageAttachment",
    "load_file_async",
    "load_image_file_async",
    "load_qimage_async",
]

log = logging.getLogger(__name__)

_IMAGES = "*.png *.jpg *.jpeg *.webp *.gif *.bmp"
_DOCUMENTS = " ".join(f"*.{suffix}" for suffix in SUFFIXES)
ATTACH_FILE_FILTER = f"Images and documents ({_IMAGES} {_DOCUMENTS});;Images ({_IMAGES});;Documents ({_DOCUMENTS})"
_IMAGE_SUFFIXES = {"jpeg", *FORMATS.values()}


def qimage_to_png(image: QImage) -> bytes:
    """PNG bytes of a QImage (a pasted clipboard image); safe on a worker thread."""
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(buffer.data())


async def load_image_file_async(path: str | Path) -> ImageAttachment:
    """`load_image_file` on a worker thread, so decoding a big photo never stalls the window."""
    return await in_worker(load_image_file, path, pool=FILES)


async def load_file_async(path: str | Path, backend: object = None) -> ImageAttachment | AttachedDocument:
    """A picked or dropped file checked on a worker thread: a document (read, counted with `backend`'s model
    when one is loaded, cut into passages) or an image. `AttachmentError` or `DocumentError` says why not."""
    path = Path(path)
    if document_kind(path) is not None:
        count = token_counter(backend)
        context_length = backend.context_length if count is not None else 0
        return await in_worker(prepare_document, path, count, context_length, pool=FILES)
    try:
        return await load_image_file_async(path)
    except AttachmentError as e:
        # A picture under another name still attaches; a file of no known kind is said to be one.
        if path.suffix.lower().lstrip(".") in _IMAGE_SUFFIXES or not path.is_file():
            raise
        raise unknown_kind_error(path.name) from e


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


class _Chip(QFrame):
    """A document waiting to be sent: its name and size, and ✕."""

    remove_clicked = Signal()

    def __init__(self, document: AttachedDocument, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("documentChip")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 2, 2, 2)
        self.label = QLabel(f"📄 {document.name}\n{summary(document)}")
        counted = "counted with the loaded model's tokenizer" if document.counted else "estimated (no model loaded)"
        notes = "".join(f"\n{note}" for note in document.notes)
        self.label.setToolTip(f"{document.name}: {len(document.passages)} passages; tokens {counted}.{notes}")
        layout.addWidget(self.label)
        remove = QToolButton(text="✕")
        remove.setToolTip(f"Remove {document.name}")
        remove.setAutoRaise(True)
        remove.clicked.connect(self.remove_clicked)
        self.remove_button = remove
        layout.addWidget(remove)


class AttachmentStrip(QWidget):
    """Thumbnails of the images and chips of the documents that go with the next message; each removable.
    Hidden when empty."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._items: list[tuple[ImageAttachment | AttachedDocument, QWidget]] = []
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addStretch()
        self.setVisible(False)

    def add(self, attachment: ImageAttachment | AttachedDocument) -> None:
        item = _Chip(attachment, self) if isinstance(attachment, AttachedDocument) else _Thumb(attachment, self)
        item.remove_clicked.connect(lambda t=item: self._remove(t))
        self._layout.insertWidget(len(self._items), item)
        self._items.append((attachment, item))
        self.setVisible(True)
        self.changed.emit()

    def attachments(self) -> list[ImageAttachment]:
        """The images of the next message."""
        return [a for a, _ in self._items if isinstance(a, ImageAttachment)]

    def documents(self) -> list[AttachedDocument]:
        """The documents of the next message, in the order attached."""
        return [a for a, _ in self._items if isinstance(a, AttachedDocument)]

    def remove_at(self, index: int) -> None:
        self._remove(self._items[index][1])

    def clear(self) -> None:
        for _, thumb in self._items:
            thumb.deleteLater()
        self._items.clear()
        self.setVisible(False)
        self.changed.emit()

    def _remove(self, thumb: QWidget) -> None:
        self._items = [(a, t) for a, t in self._items if t is not thumb]
        thumb.deleteLater()
        self.setVisible(bool(self._items))
        self.changed.emit()
