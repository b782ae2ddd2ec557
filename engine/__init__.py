"""Tandem's inference engine: models, loading, tokenizer, paged KV cache, generator, sampler."""

from engine.cache import Cache
from engine.models import Batch, Model

__all__ = ["Batch", "Cache", "Model"]
