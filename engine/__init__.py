"""Tandem's inference engine: models, loading, tokenizer, paged KV cache, generator, sampler."""

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.dynamic_async import DynamicGeneratorAsync, DynamicJobAsync, GeneratorClosedError
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.loading import model as _loading  # noqa: F401  (registers Model.load's loader)
from engine.models import Batch, Model
from engine.tokenizer.tokenizer import Tokenizer
from engine.vision.embedding import MMEmbedding

__all__ = [
    "Batch",
    "Cache",
    "DynamicGenerator",
    "DynamicGeneratorAsync",
    "DynamicJob",
    "DynamicJobAsync",
    "GeneratorClosedError",
    "MMEmbedding",
    "Model",
    "SamplerSettings",
    "Tokenizer",
]
