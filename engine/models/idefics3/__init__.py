"""Idefics3 (SmolVLM): LLaVA's SigLIP with interpolated positions (tower.py), the pixel-shuffle connector
(connector.py), the tiling processor and its prompt text (processor.py), and the model with its vision handle
(model.py)."""

from engine.models.idefics3.model import Idefics3ForConditionalGeneration, Idefics3Vision

__all__ = ["Idefics3ForConditionalGeneration", "Idefics3Vision"]
