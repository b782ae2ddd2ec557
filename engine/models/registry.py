"""Hugging Face architecture string -> model class."""

from __future__ import annotations

from engine.errors import UnsupportedArchitectureError
from engine.models.base import Model
from engine.models.gemma3.model import Gemma3ForConditionalGeneration
from engine.models.idefics3.model import Idefics3ForConditionalGeneration
from engine.models.llava.model import LlavaForConditionalGeneration
from engine.models.mistral3.model import Mistral3ForConditionalGeneration
from engine.models.qwen2_vl.model import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration
from engine.models.text_models import TEXT_MODELS

_MODELS: dict[str, type[Model]] = {
    **TEXT_MODELS,
    **{
        arch: cls
        for cls in (
            Qwen2VLForConditionalGeneration,
            Qwen2_5_VLForConditionalGeneration,
            LlavaForConditionalGeneration,
            Idefics3ForConditionalGeneration,
            Gemma3ForConditionalGeneration,
            Mistral3ForConditionalGeneration,
        )
        for arch in cls.architectures
    },
}


def vision_architectures() -> list[str]:
    """Architectures that take images (their class encodes pixels into embedding rows)."""
    return sorted(arch for arch, cls in _MODELS.items() if hasattr(cls, "encode_images"))


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def model_class(architecture: str) -> type[Model]:
    try:
        return _MODELS[architecture]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"architecture {architecture!r} is not supported. Supported: {', '.join(supported_architectures())}."
        ) from None
