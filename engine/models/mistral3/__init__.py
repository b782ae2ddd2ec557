"""Mistral 3 and Pixtral-LLaVA: the Pixtral tower with 2D rotary positions (pixtral.py), its processor and
[IMG]/[IMG_BREAK]/[IMG_END] layout (processor.py), and the models with their vision handle (model.py)."""

from engine.models.mistral3.model import (
    Mistral3ForConditionalGeneration,
    PixtralLlavaForConditionalGeneration,
    PixtralVision,
)

__all__ = ["Mistral3ForConditionalGeneration", "PixtralLlavaForConditionalGeneration", "PixtralVision"]
