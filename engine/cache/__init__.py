"""The paged KV cache: tensors (cache.py) and, separately, which pages hold what (page_table.py)."""

from engine.cache.cache import Cache

__all__ = ["Cache"]
