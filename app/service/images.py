"""The app's pictures (stored files, just-attached bytes) -> the engine's image embeddings, on the vision worker.

The embeddings themselves are kept by the model's chat front door (engine.chat.door), one LRU per model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from engine.chat.door import ChatFrontDoor
from engine.errors import ImageError
from engine.vision.embedding import MMEmbedding


@dataclass(frozen=True)
class KnownImage:
    """A picture the window has just checked and stored, with the sha256 of its bytes (the store's name for
    it): sending it neither reads the file again nor hashes the bytes again. Pictures of earlier messages go
    as their stored files' paths, read and hashed at each send, which is what notices a file damaged on disk."""

    data: bytes
    sha256: str
    name: str


ImageSource = str | Path | bytes | KnownImage


def embed_all(door: ChatFrontDoor, images: list[ImageSource]) -> list[MMEmbedding]:
    """Vision worker: embed each image through `door` (its model's LRU, keyed by the sha256 of the bytes).

    Each file is read once and its bytes hashed once (a KnownImage brings both); the door decodes those bytes
    and takes that digest for the embedding's ids, so neither the file nor the pixels are read or hashed again.
    """
    out = []
    for source in images:
        data, name = read_image(source)
        key = source.sha256 if isinstance(source, KnownImage) else hashlib.sha256(data).hexdigest()
        out.append(door.embed_image(data, name=name, key=key))
    return out


def read_image(source: ImageSource) -> tuple[bytes, str | None]:
    """The image's bytes and the name its errors give it (the path, a KnownImage's name; None lets bytes be
    named by their size). ImageError for a file that cannot be read."""
    if isinstance(source, KnownImage):
        return source.data, source.name
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), None
    try:
        return Path(source).read_bytes(), str(source)
    except OSError as e:
        raise ImageError(
            f"cannot read the image {source}: {e.strerror or e}. It may have been moved or deleted; attach it again."
        ) from None
