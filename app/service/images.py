"""Image embeddings for the service: one LRU per loaded model, filled on the vision worker thread."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from engine.errors import ImageError
from engine.vision.embedding import MMEmbedding

log = logging.getLogger(__name__)

# Image embeddings kept per model, so resending or regenerating a chat does not run the vision tower again.
# A LLaVA-1.5-7B image is 576 x 4096 bf16 rows (4.5 MB); 32 of them stay well under the KV cache's share.
IMAGE_CACHE_SIZE = 32

ImageSource = str | Path | bytes


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
    through its LRU (`.images`)."""
    out = []
    for source in images:
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
        else:
            try:
                data = Path(source).read_bytes()
            except OSError as e:
                raise ImageError(
                    f"cannot read the image {source}: {e.strerror or e}. It may have been moved or deleted; "
                    "attach it again."
                ) from None
        key = hashlib.sha256(data).hexdigest()
        embedding = loaded.images.get(key)
        if embedding is None:
            # A path rather than the bytes, so the vision side's errors name the file.
            image = data if isinstance(source, (bytes, bytearray, memoryview)) else source
            with torch.no_grad():
                embedding = loaded.vision.get_image_embeddings(
                    model=loaded.model, tokenizer=loaded.tokenizer, image=image
                )
            loaded.images.put(key, embedding)
            log.info("%s: embedded image %s (%d tokens)", loaded.name, key[:12], embedding.num_tokens)
        out.append(embedding)
    return out
