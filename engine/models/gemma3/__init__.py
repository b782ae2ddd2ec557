"""Gemma 3: the text model (text.py, also a text-only architecture), the pooling projector (projector.py) and
the vision-language model with its vision handle (model.py), which uses LLaVA's SigLIP tower and processor."""

from engine.models.gemma3.model import Gemma3ForConditionalGeneration, Gemma3ImageEmbedding, Gemma3Vision
from engine.models.gemma3.text import Gemma3ForCausalLM

__all__ = ["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Gemma3ImageEmbedding", "Gemma3Vision"]
