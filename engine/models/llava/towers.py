"""The vision encoder class for a `vision_config.model_type` (CLIP or SigLIP)."""

from __future__ import annotations

from torch import nn

from engine.errors import UnsupportedArchitectureError
from engine.models.llava.clip import ClipVisionTower
from engine.models.llava.siglip import SiglipVisionTower

TOWERS: dict[str, type[nn.Module]] = {cls.model_type: cls for cls in (ClipVisionTower, SiglipVisionTower)}


def vision_tower_class(model_type: str) -> type[nn.Module]:
    """The encoder class for a `vision_config.model_type`, or UnsupportedArchitectureError naming it."""
    try:
        return TOWERS[model_type]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"vision_config model_type {model_type!r} is not supported as a vision encoder; supported: "
            f"{', '.join(sorted(TOWERS))}. Use a checkpoint with one of those encoders."
        ) from None
