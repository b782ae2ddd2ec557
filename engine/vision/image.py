"""Decoding user images into fully loaded RGB Pillow images, refusing anything unsafe or unreadable.

`decode_image` is the one door images come through, for the app's attachments, the engine's vision handles
and the server's data: URLs alike (a dropped file, pasted bytes, an open Pillow image): it checks the size
the header declares against the one limit (`check_size`) before any pixel is decoded, applies EXIF
orientation, takes the first frame of animations and turns every Pillow mode into 8-bit RGB. Every failure
is an `ImageError` whose message names the image and says what to do.

    file / bytes --read once--> decode_image --> DecodedImage(picture, format, content_hash)
                                  |                 (hashed once, when first asked, or given by a
                                  check_size         caller that already hashed the bytes)
"""

from __future__ import annotations

import io
import logging
import os
import re
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from engine.errors import ImageError
from engine.vision.embedding import content_hash

logger = logging.getLogger(__name__)


# What Pillow raises while parsing or decoding a damaged file; all of them become ImageError.
_DECODE_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    IndexError,
    KeyError,
    struct.error,
    zlib.error,
    Image.DecompressionBombError,
)

# Leading bytes of common formats: a file that starts like one but does not open is damaged, not foreign.
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)
# The formats images are decoded from, chosen by content (Pillow tries only these plugins, whatever the name
# says). Pillow's others include EPS, which it hands to Ghostscript: a file with `{ } loop` in it hung the
# engine; and rare formats are where decoders' bugs live.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
# Decoding's memory budget: the decoded pixels and the copies made converting them (16-bit and float modes go
# through int32 strips, so a large 16-bit PNG never holds all its int32 copies at once; transparency is
# composited on white, three RGBA images).
MAX_DECODE_BYTES = 1 << 30
_SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")
# The one limit on a picture, per side and in all, for the app's attachments, the engine and the server. 64 MP:
# 48 and 50 MP phone photos are common, and decoding 64 MP to RGB takes 192 MB, well inside MAX_DECODE_BYTES.
MAX_SIDE = 8192
MAX_PIXELS = 64_000_000


@dataclass(eq=False)
class DecodedImage:
    """A picture that passed the one check, decoded once: its RGB pixels (EXIF-oriented), the format its bytes
    were in (None for a picture given as a Pillow image without one) and the name messages give it.

    `content_hash` names its content for MMEmbedding ids and caches: the digest a caller already computed from
    the bytes (passed to `decode_image`), or else the digest of the pixels, computed once on first use.
    """

    picture: Image.Image
    format: str | None
    name: str
    digest: str | None = field(default=None, repr=False)

    @property
    def content_hash(self) -> str:
        if self.digest is None:
            self.digest = image_content_hash(self.picture)
        return self.digest


ImageSource = str | Path | bytes | bytearray | memoryview | Image.Image | DecodedImage


def decode_image(
    source: ImageSource,
    *,
    name: str | None = None,
    content_hash: str | None = None,
    max_side: int = MAX_SIDE,
    max_pixels: int = MAX_PIXELS,
) -> DecodedImage:
    """Check and decode `source` (a path, encoded bytes, or an open Pillow image) into a DecodedImage.

    The declared size is checked against `max_side` (pixels per side) and `max_pixels` (width x
    height) before decoding, so a small file that declares a huge canvas is refused without
    allocating it. Animated images give their first frame (an open image is rewound to frame 0, so
    one picture always yields the same pixels). `name` is how error messages call the image (the path,
    or "the image data (N bytes)", by default); `content_hash` is a digest the caller already has of
    the bytes, kept rather than hashing again. A DecodedImage is returned as it is. Raises `ImageError`
    for anything that cannot be used.
    """
    if isinstance(source, DecodedImage):
        return source
    if isinstance(source, Image.Image):
        label = name or "the given image"
        return DecodedImage(_decode(source, label, max_side, max_pixels), source.format, label, content_hash)
    with _opened(source, max_side, max_pixels, name) as (opened, label):
        return DecodedImage(_decode(opened, label, max_side, max_pixels), opened.format, label, content_hash)


def load_image(source: ImageSource, *, max_side: int = MAX_SIDE, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """The loaded RGB picture of `source` (`decode_image(source).picture`)."""
    return decode_image(source, max_side=max_side, max_pixels=max_pixels).picture


def check_size(name: str, width: int, height: int, *, max_side: int = MAX_SIDE, max_pixels: int = MAX_PIXELS) -> None:
    """Raise ImageError when a width x height picture is empty or over the limit: the one size check, for a
    header's declared size before decoding and for a pasted picture before it is encoded."""
    if width < 1 or height < 1:
        raise ImageError(f"{name} has no pixels ({width}x{height}): use an image at least 1x1")
    if max(width, height) > max_side or width * height > max_pixels:
        declared = f"{width}x{height} ({width * height} pixels)"
        raise ImageError(_too_large_message(name, declared, max_side, max_pixels))


def oriented_size(source: ImageSource) -> tuple[int, int]:
    """(width, height) of the picture `load_image(source)` gives, from the header and the EXIF orientation:
    the pixels are not decoded. Raises `ImageError` for a source that cannot be opened as an image."""
    if isinstance(source, DecodedImage):
        return source.picture.size
    if isinstance(source, Image.Image):
        return _oriented_size(source)
    with _opened(source, MAX_SIDE, MAX_PIXELS) as (opened, _):
        return _oriented_size(opened)


def _oriented_size(image: Image.Image) -> tuple[int, int]:
    width, height = image.size
    try:
        orientation = image.getexif().get(ExifTags.Base.Orientation)
    except _DECODE_ERRORS:
        orientation = None  # load_image fails on such a file; the count does not need to
    # Orientations 5 to 8 turn the picture a quarter, so exif_transpose swaps its sides.
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


@contextmanager
def _opened(
    source: ImageSource, max_side: int, max_pixels: int, name: str | None = None
) -> Iterator[tuple[Image.Image, str]]:
    """A lazily opened Pillow image of a path or encoded bytes, and the name error messages give it. A file is
    read as Pillow needs it: its header alone for a size, every byte once for a decode."""
    stream, name = _stream(source, name)
    with stream:
        try:
            image = Image.open(stream, formats=FORMATS)
        except UnidentifiedImageError:
            stream.seek(0)
            kind = _looks_like(stream.read(16))
            if kind is not None:
                raise ImageError(
                    f"{name} starts like a {kind} file but is truncated or corrupt: re-save or re-download it"
                ) from None
            raise ImageError(
                f"{name} is not an image Pillow can read (formats: {_format_list()}); "
                "convert it to PNG or JPEG and try again"
            ) from None
        except Image.DecompressionBombError as exc:
            # Pillow refuses canvases over twice its own limit inside `open`, before we see the size.
            raise ImageError(_too_large_message(name, _bomb_size(exc), max_side, max_pixels)) from None
        except _DECODE_ERRORS as exc:
            raise ImageError(f"{name} is corrupt or truncated ({exc}): re-save or re-download it") from None
        with image:
            yield image, name


def _stream(source: ImageSource, name: str | None) -> tuple[BinaryIO, str]:
    """An open binary stream of a path or encoded bytes holding at least one byte, and the image's name."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        stream: BinaryIO = io.BytesIO(data)
        size = len(data)
        name = name or f"the image data ({size} bytes)"
    elif isinstance(source, (str, Path)):
        name = name or str(source)
        stream = _open_file(Path(source))
        size = os.fstat(stream.fileno()).st_size
    else:
        raise ImageError(
            f"cannot load an image from a {type(source).__name__}: pass a file path, the file's bytes, "
            "or a PIL.Image.Image"
        )
    if not size:
        stream.close()
        raise ImageError(f"{name} is empty (0 bytes): it is not an image; re-save or re-download it")
    return stream, name


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert a loaded image of any Pillow mode to 8-bit RGB (always a new image object).

    Transparent pixels are composited on white: a model sees the picture as a viewer on a light
    page would, and the colour Pillow stores under alpha 0 (often black or garbage) never leaks in.
    This is also what transformers' `convert_rgb` does, so preprocessing agrees with the reference.
    """
    rgb = _convert_rgb(image)
    return rgb.copy() if rgb is image else rgb


def _convert_rgb(image: Image.Image) -> Image.Image:
    """`to_rgb` without the defensive copy: an image already in plain RGB is returned as is."""
    mode = image.mode
    if mode in _SIXTEEN_BIT_MODES or mode == "I":
        image = _sixteen_bit_to_l(image)
    elif mode == "F":
        image = _float_to_l(image)
    if "A" in image.getbands() or "a" in image.getbands() or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def image_content_hash(image: Image.Image) -> str:
    """Digest of the decoded RGB pixels and the size: two encodings of one picture hash equal.

    The size is part of the key because the same bytes can be read as different shapes (2x6 vs 3x4).
    """
    rgb = image if image.mode == "RGB" else to_rgb(image)
    width, height = rgb.size
    return content_hash(f"{width}x{height}:".encode() + rgb.tobytes())


def _open_file(path: Path) -> BinaryIO:
    if not path.exists():
        raise ImageError(f"no image at {path}: the file does not exist (moved or deleted?)")
    if path.is_dir():
        raise ImageError(f"{path} is a folder, not an image file: choose an image inside it")
    try:
        return path.open("rb")
    except OSError as exc:
        reason = exc.strerror or exc
        raise ImageError(f"cannot read {path}: {reason}; check that the file is readable") from None


def _decode(image: Image.Image, name: str, max_side: int, max_pixels: int) -> Image.Image:
    """Check the declared size, then load, orient and convert; `image` may still be lazy."""
    width, height = image.size
    check_size(name, width, height, max_side=max_side, max_pixels=max_pixels)
    needed = _decode_bytes(image)
    if needed > MAX_DECODE_BYTES:
        raise ImageError(
            f"{name} would need about {needed / 2**20:,.0f} MB to decode ({width}x{height}, mode {image.mode}), over "
            f"the {MAX_DECODE_BYTES / 2**20:,.0f} MB budget; shrink the image or save it as an 8-bit RGB JPEG"
        )
    try:
        # tell() first: n_frames walks the whole file for some formats (GIF).
        if image.tell() != 0:
            image.seek(0)
        image.load()
        # exif_transpose returns a new image (or a copy), so the result never shares the file handle.
        oriented = ImageOps.exif_transpose(image)
    except Image.DecompressionBombError as exc:
        raise ImageError(_too_large_message(name, _bomb_size(exc), max_side, max_pixels)) from None
    except _DECODE_ERRORS as exc:
        raise ImageError(f"{name} is corrupt or truncated ({exc}): re-save or re-download it") from None
    try:
        return _convert_rgb(oriented)
    except _DECODE_ERRORS as exc:
        raise ImageError(
            f"{name} uses the Pillow mode {oriented.mode!r}, which cannot be converted to RGB ({exc}); "
            "re-save it as an RGB PNG or JPEG"
        ) from None


def _decode_bytes(image: Image.Image) -> int:
    """About the peak memory of decoding and converting `image`: its pixels in their own mode, the 8-bit
    result, and for transparent pictures the three RGBA images of compositing."""
    pixels = image.size[0] * image.size[1]
    per_pixel = {"1": 1, "L": 1, "P": 1, "RGB": 3, "RGBA": 4, "CMYK": 4, "YCbCr": 3, "LA": 2, "PA": 2}
    own = per_pixel.get(image.mode, 4)  # I;16 modes, I and F: up to 4 bytes a pixel
    alpha = "A" in image.mode or "transparency" in image.info or image.mode == "P"
    return pixels * (own + 3 + (12 if alpha else 0))


_STRIP_ROWS = 256  # rows converted at a time from 16-bit or float: a strip's int64 copies stay a few MB


def _sixteen_bit_to_l(image: Image.Image) -> Image.Image:
    # Pillow's own convert clips 16-bit values at 255, which turns most of a 16-bit picture white;
    # scale the full 0..65535 range to 0..255 instead (mode "I" comes from 16-bit PNG/TIFF files).
    values = np.asarray(image)
    out = np.empty(values.shape, dtype=np.uint8)
    for top in range(0, values.shape[0], _STRIP_ROWS):
        strip = np.clip(values[top : top + _STRIP_ROWS].astype(np.int64), 0, 65535)
        out[top : top + _STRIP_ROWS] = (strip * 255 + 32767) // 65535
    return Image.fromarray(out, mode="L")


def _float_to_l(image: Image.Image) -> Image.Image:
    # Float images carry no declared range: [0, 1] is the usual convention, anything else is taken
    # as already 0..255 and clipped (what Pillow's convert would do).
    values = np.asarray(image, dtype=np.float64)
    values = np.nan_to_num(values, nan=0.0, posinf=255.0, neginf=0.0)
    if values.size and values.min() >= 0.0 and values.max() <= 1.0:
        values = values * 255.0
    return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8), mode="L")


def _too_large_message(name: str, declared: str, max_side: int, max_pixels: int) -> str:
    return (
        f"{name} is too large to decode safely: it declares {declared}, and the limit is "
        f"{max_side} pixels per side and {max_pixels} pixels in all; shrink the image and try again"
    )


def _bomb_size(exc: Exception) -> str:
    # Pillow's message reads "Image size (N pixels) exceeds limit of M pixels, ..."; keep just N.
    found = re.search(r"\((\d+) pixels\)", str(exc))
    return f"{found.group(1)} pixels" if found else str(exc)


def _looks_like(data: bytes) -> str | None:
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def _format_list() -> str:
    return ", ".join(FORMATS)
