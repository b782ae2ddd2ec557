"""The pixel steps every image processor shares, with transformers' PIL processors' arithmetic: 8-bit RGB in,
rescaled in float64 then float32, normalised in float32 out, so pixel values agree with theirs to the bit."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from PIL import Image

from engine.vision.image import to_rgb


def rgb_for_model(image: Image.Image, do_convert_rgb: bool) -> Image.Image:
    """`image` as the 3-channel picture an encoder takes. With do_convert_rgb, transparency is composited on
    white (transformers' convert_rgb); without it, other modes are converted plainly (alpha dropped)."""
    if do_convert_rgb and (image.mode != "RGB" or "transparency" in image.info):
        return to_rgb(image)
    return image if image.mode == "RGB" else image.convert("RGB")


class PixelScaling(Protocol):
    """The options of a processor that `normalised` reads (every processor here has them)."""

    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]


def normalised(image: Image.Image | np.ndarray, scaling: PixelScaling) -> torch.Tensor:
    """An RGB picture (or its [H, W, 3] uint8 pixels) as [3, H, W] float32: times rescale_factor, then
    (x - mean) / std per channel, each step where `scaling`'s flag says."""
    pixels = np.asarray(image)  # [H, W, 3] uint8
    if scaling.do_rescale:
        # float64 product then float32, the order transformers uses, so the values agree to the last bit.
        pixels = (pixels.astype(np.float64) * scaling.rescale_factor).astype(np.float32)
    values = torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32))  # [H, W, 3]
    if scaling.do_normalize:
        mean = torch.tensor(scaling.image_mean, dtype=torch.float32)
        std = torch.tensor(scaling.image_std, dtype=torch.float32)
        values = (values - mean) / std
    return values.permute(2, 0, 1).contiguous()
