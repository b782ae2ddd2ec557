"""Image embeddings for the service: one LRU per loaded model, filled on the vision worker thread."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import ImageError
from engine.vision.embedding import MMEmbedding
from engine.vision.image import decode_image

log = logging.getLogger(__name__)

# Image embeddings kept per model, so resending or regenerating a chat does not run the vision tower again.
# A LLaVA-1.5-7B image is 576 x 4096 bf16 rows (4.5 MB); 32 of them stay well under the KV cache's share.
IMAGE_CACHE_SIZE = 32


@dataclass(frozen=True)
class KnownImage:
    """A picture the window has just checked and stored, with the sha256 of its bytes (the store's name for
    it): sending it neither reads the file again nor hashes the bytes again. Pictures of earlier messages go
    as their stored files' paths, read and hashed at each send, which is what notices a file damaged on disk."""

    data: bytes
    sha256: str
    name: str


ImageSource = str | Path | bytes | KnownImage


class EmbeddingCache:
    """A small LRU of one model's image embeddings, by sha256 of the image file's bytes; thread-safe."""

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._items: OrderedDict[str, MMEmbedding] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> MMEmbedding | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: str, item: MMEmbedding) -> None:
        with self._lock:
            self._items[key] = item
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def embed_all(loaded: Any, images: list[ImageSource]) -> list[MMEmbedding]:
    """Vision worker: embed each image with `loaded`'s model (`.model`, `.tokenizer`, `.vision`, `.name`),
    through its LRU (`.images`).

    Each file is read once and its bytes hashed once (sha256, the LRU key; a KnownImage brings both); on a miss the engine's one door,
    `decode_image`, checks and decodes those bytes and takes that digest for the embedding's ids, so the
    vision handle neither reads the file again nor hashes the pixels.
    """
    out = []
    for source in images:
        data, name = read_image(source)
        key = source.sha256 if isinstance(source, KnownImage) else hashlib.sha256(data).hexdigest()
        embedding = loaded.images.get(key)
        if embedding is None:
            image = decode_image(data, name=name, content_hash=key)
            with torch.no_grad():
                embedding = loaded.vision.get_image_embeddings(
                    model=loaded.model, tokenizer=loaded.tokenizer, image=image
                )
            loaded.images.put(key, embedding)
            log.info("%s: embedded image %s (%d tokens)", loaded.name, key[:12], embedding.num_tokens)
        out.append(embedding)
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
