"""Model families. `registry.model_class(architecture)` finds the class for a checkpoint."""

from engine.models.base import Model
from engine.models.batch import Batch

__all__ = ["Batch", "Model"]
