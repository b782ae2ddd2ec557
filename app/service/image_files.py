"""Checking image files before they attach to a message: the engine's check, the window's own caps.

The check is the engine's, `engine.vision.image.decode_image`, with its one size limit, so what attaches is
what the model can read; the window adds only its own file-size cap and the formats it shows again from the
store. Every refusal raises `AttachmentError`, whose message names the file and says what to do.
The UI calls these through `app.service.workers` (decoding a big photo takes a while).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ImageError
from engine.vision.image import check_size, decode_image

MAX_FILE_BYTES = 32 * 1024 * 1024
THUMBNAIL_SIZE = 96
# The formats the window attaches (and shows again from the store with Qt), by Pillow's name -> file suffix.
FORMATS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp"}


class AttachmentError(ImageError):
    """A file that cannot be attached: not an image, corrupt, truncated, too big, or of a format not attached."""


@dataclass(frozen=True)
class ImageAttachment:
    """A checked image waiting to be sent: its original bytes, their sha256 (the store's name for them, the
    image embeddings' key), file suffix, size and a small PNG thumbnail."""

    name: str
    data: bytes
    suffix: str
    width: int
    height: int
    thumbnail_png: bytes
    sha256: str


def check_pixels(name: str, width: int, height: int) -> None:
    """Refuse an image whose pixel size the engine would refuse, before any bytes are made of it."""
    try:
        check_size(name, width, height)
    except ImageError as e:
        raise AttachmentError(str(e)) from e


def check_image_bytes(data: bytes, name: str) -> ImageAttachment:
    """Check that `data` is a whole, readable image of a supported format and sensible size.

    Slow for big images (decodes every pixel, which is what finds a truncated file): run it on a worker.
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
    if kind not in FORMATS:
        raise AttachmentError(f"{name} is a {kind or 'unknown'} image; Tandem attaches PNG, JPEG, WebP, GIF and BMP.")
    thumb = image.picture.copy()
    thumb.thumbnail((THUMBNAIL_SIZE * 2, THUMBNAIL_SIZE * 2))
    out = io.BytesIO()
    thumb.save(out, "PNG")
    width, height = image.picture.size
    return ImageAttachment(name, data, FORMATS[kind], width, height, out.getvalue(), hashlib.sha256(data).hexdigest())


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
