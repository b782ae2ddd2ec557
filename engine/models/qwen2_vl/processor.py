"""Qwen2-VL / Qwen2.5-VL image preprocessing: dynamic resolution and the flattened patch layout.

    RGB -> resize (PIL) so both sides are multiples of patch_size * merge_size and the area lies within
        [min_pixels, max_pixels] (`smart_resize`) -> rescale -> normalise -> patches

An image is not squeezed to a fixed size: its grid of patches follows its own aspect ratio. The patches come
out as rows of one matrix, ordered so that each merge_size x merge_size block of neighbours (the patches the
vision model's merger fuses into one text-model token) is consecutive:

    pixel_values [grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size]
    row order:   block row, block column, row inside the block, column inside the block
    row layout:  channel, time (the still image repeated temporal_patch_size times), pixel row, pixel column

`grid_thw` = (1, grid_h, grid_w) counts patches; the image becomes grid_h * grid_w / merge_size**2 tokens.
The arithmetic is that of transformers' Qwen2VLImageProcessorPil (PIL resize on 8-bit pixels, rescale in
float64 then float32, normalise in float32), so pixel values agree with it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from engine.errors import ImageError
from engine.vision.options import (
    bool_option,
    positive_float,
    positive_int,
    processor_options,
    read_processor_config,
    resample_code,
    three_numbers,
)
from engine.vision.pixels import normalised, rgb_for_model

logger = logging.getLogger(__name__)

_KINDS = {f"{family}ImageProcessor{suffix}" for family in ("Qwen2VL", "Qwen2_5_VL") for suffix in ("", "Fast", "Pil")}
# transformers' class defaults (Qwen2VLImageProcessorPil); min/max pixels are its size's shortest/longest edge.
_DEFAULTS: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280},
    "resample": int(Image.Resampling.BICUBIC),
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": (0.48145466, 0.4578275, 0.40821073),
    "image_std": (0.26862954, 0.26130258, 0.27577711),
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
}
# Keys that describe the file or videos, not the pixels of one image.
_IGNORED = ("image_processor_type", "processor_class", "auto_map", "min_pixels", "max_pixels", "data_format")
# transformers refuses images more elongated than this.
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class PatchedImage:
    """One preprocessed image: `pixel_values` [num_patches, patch_dim] float32 and its patch grid (t, h, w)."""

    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) with both sides multiples of `factor`, the area within [min_pixels, max_pixels] where
    the aspect ratio allows, and the aspect ratio kept as closely as that permits.

    Each side is first rounded to the nearest multiple (Python's round: halves to even, as the reference);
    an area over the maximum is scaled down (sides rounded down, at least one `factor`), one under the
    minimum scaled up (sides rounded up). Raises ImageError for a side of 0 or a ratio above 200:1.
    """
    if height < 1 or width < 1:
        raise ImageError(f"the image is {width}x{height} pixels; it has no pixels to look at")
    if max(height, width) > MAX_ASPECT_RATIO * min(height, width):
        raise ImageError(
            f"the image is {width}x{height} pixels, more elongated than {MAX_ASPECT_RATIO}:1, which Qwen2-VL "
            "cannot take; crop it to a less extreme shape"
        )
    new_height = round(height / factor) * factor
    new_width = round(width / factor) * factor
    if new_height * new_width > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        new_height = max(factor, math.floor(height / beta / factor) * factor)
        new_width = max(factor, math.floor(width / beta / factor) * factor)
    elif new_height * new_width < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        new_height = math.ceil(height * beta / factor) * factor
        new_width = math.ceil(width * beta / factor) * factor
    return new_height, new_width


@dataclass(frozen=True)
class Qwen2VLImageProcessor:
    """Pixel preprocessing of Qwen2-VL and Qwen2.5-VL. Build it with `from_folder` or `from_dict`; call it on a
    PIL image to get a `PatchedImage`."""

    do_convert_rgb: bool
    do_resize: bool
    min_pixels: int
    max_pixels: int
    resample: int
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    patch_size: int
    temporal_patch_size: int
    merge_size: int

    @classmethod
    def from_folder(cls, folder: str | Path) -> Qwen2VLImageProcessor:
        """Read the image processor config of a Hugging Face model folder (preprocessor_config.json, or the
        `image_processor` section of processor_config.json)."""
        config, source, _ = read_processor_config(folder, "prepared for the vision model")
        return cls.from_dict(config, source=source)

    @classmethod
    def from_dict(cls, config: dict[str, Any], *, source: str = "the processor config") -> Qwen2VLImageProcessor:
        """Parse a `preprocessor_config.json` dict; `source` names it in error messages.

        Pixel limits come from `size` ({"shortest_edge": min_pixels, "longest_edge": max_pixels}); top-level
        `min_pixels` / `max_pixels`, as released Qwen2-VL configs write them, take precedence (transformers'
        rule).
        """
        opts = processor_options(config, source, family="Qwen2-VL", kinds=_KINDS, defaults=_DEFAULTS, ignored=_IGNORED)
        size = opts["size"]
        if not isinstance(size, dict) or not {"shortest_edge", "longest_edge"} <= set(size):
            raise ValueError(
                f"{source}: size={size!r} is not supported; use {{'shortest_edge': MIN_PIXELS, 'longest_edge': "
                "MAX_PIXELS}"
            )
        min_pixels = config["min_pixels"] if config.get("min_pixels") is not None else size["shortest_edge"]
        max_pixels = config["max_pixels"] if config.get("max_pixels") is not None else size["longest_edge"]
        min_pixels = positive_int(min_pixels, "min_pixels (size.shortest_edge)", source)
        max_pixels = positive_int(max_pixels, "max_pixels (size.longest_edge)", source)
        if min_pixels > max_pixels:
            raise ValueError(f"{source}: min_pixels {min_pixels} is larger than max_pixels {max_pixels}")
        return cls(
            do_convert_rgb=bool_option(opts, "do_convert_rgb", source),
            do_resize=bool_option(opts, "do_resize", source),
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            resample=resample_code(opts["resample"], source),
            do_rescale=bool_option(opts, "do_rescale", source),
            rescale_factor=positive_float(opts["rescale_factor"], "rescale_factor", source),
            do_normalize=bool_option(opts, "do_normalize", source),
            image_mean=three_numbers(opts["image_mean"], "image_mean", source, positive=False),
            image_std=three_numbers(opts["image_std"], "image_std", source, positive=True),
            patch_size=positive_int(opts["patch_size"], "patch_size", source),
            temporal_patch_size=positive_int(opts["temporal_patch_size"], "temporal_patch_size", source),
            merge_size=positive_int(opts["merge_size"], "merge_size", source),
        )

    @property
    def factor(self) -> int:
        """Both sides of a resized image are multiples of this many pixels (one merged block of patches)."""
        return self.patch_size * self.merge_size

    def resized_hw(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) the image is resized to (unchanged without do_resize)."""
        if not self.do_resize:
            return height, width
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) of a height x width image as the vision model takes it: whole merged blocks."""
        height, width = self.resized_hw(height, width)
        if height % self.factor or width % self.factor:
            raise ImageError(
                f"the image is {width}x{height} pixels but Qwen2-VL needs sides that are multiples of {self.factor} "
                "(patch_size * merge_size); turn do_resize on in preprocessor_config.json or resize the image"
            )
        return height, width

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """The patch grid (t, h, w) of a height x width image, from its size alone (what `__call__` gives)."""
        height, width = self.output_hw(height, width)
        return 1, height // self.patch_size, width // self.patch_size

    def __call__(self, image: Image.Image) -> PatchedImage:
        """Preprocess one image into its patches and grid."""
        if not isinstance(image, Image.Image):
            raise TypeError(
                f"Qwen2VLImageProcessor takes a PIL.Image.Image, got {type(image).__name__}; "
                "decode files and bytes with engine.vision.image.load_image first"
            )
        image = rgb_for_model(image, self.do_convert_rgb)  # the vision model takes 3 channels whatever the flag says
        height, width = self.output_hw(image.height, image.width)
        if (height, width) != (image.height, image.width):
            image = image.resize((width, height), resample=self.resample)
        return self._patchify(normalised(image, self))

    def _patchify(self, values: torch.Tensor) -> PatchedImage:
        """[C, H, W] -> the flattened patch rows described in the module docstring."""
        channels, height, width = values.shape
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = height // p, width // p
        blocks = values.reshape(channels, grid_h // m, m, p, grid_w // m, m, p)
        # -> [block row, block col, row in block, col in block, channel, pixel row, pixel col]
        blocks = blocks.permute(1, 4, 2, 5, 0, 3, 6)
        # A still image fills every time step of a temporal patch with the same frame.
        frames = blocks.unsqueeze(5).expand(*blocks.shape[:5], t, p, p)
        rows = frames.reshape(grid_h * grid_w, channels * t * p * p).contiguous()
        return PatchedImage(rows, (1, grid_h, grid_w))
