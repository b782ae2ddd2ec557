"""Qwen2-VL and Qwen2.5-VL: the patch tower with its merger (tower.py), the smart-resize processor
(processor.py), and the model with multimodal rotary positions and its vision handle (model.py)."""

from engine.models.qwen2_vl.model import (
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageEmbedding,
    Qwen2VLVision,
)

__all__ = [
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2VLImageEmbedding",
    "Qwen2VLVision",
]
