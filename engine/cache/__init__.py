"""The paged KV cache: tensors (cache.py); which pages hold what (page_table.py); the manager that the scheduler
asks for pages (manager.py)."""

from engine.cache.cache import Cache

__all__ = ["Cache"]
