"""One model's image embeddings, kept by the sha256 of the image's bytes, so a chat resent or regenerated (or an
API client sending the same picture again) does not run the vision tower again."""

from __future__ import annotations

import threading
from collections import OrderedDict

from engine.vision.embedding import MMEmbedding

# A LLaVA-1.5-7B image is 576 x 4096 bf16 rows (4.5 MB); 32 of them stay well under the KV cache's share.
IMAGE_CACHE_SIZE = 32


class EmbeddingCache:
    """A small LRU of one model's image embeddings, by sha256 of the image file's bytes; thread-safe."""

    def __init__(self, capacity: int = IMAGE_CACHE_SIZE):
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
