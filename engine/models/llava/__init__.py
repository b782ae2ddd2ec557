"""LLaVA: a CLIP or SigLIP tower (clip.py, siglip.py; towers.py picks one), the projector into the text model
(projector.py), the CLIP-style image processor (processor.py) and the model with its vision handle (model.py).
Gemma 3, Idefics3 and Pixtral-LLaVA reuse its SigLIP, processor or projector."""

from engine.models.llava.model import LlavaForConditionalGeneration, LlavaVision

__all__ = ["LlavaForConditionalGeneration", "LlavaVision"]
