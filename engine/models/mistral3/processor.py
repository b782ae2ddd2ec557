"""Pixtral / Mistral 3 image preprocessing: one picture at (nearly) its own size, and its prompt layout.

    RGB -> shrink to fit `longest_edge` (aspect kept, floored) -> up to whole patches on each side (PIL)
        -> rescale -> normalise -> [3, H, W] float32, H and W multiples of `patch_size`

Here `patch_size` is the encoder's patch times the projector's merge factor (Mistral 3 merges 2 x 2 patches
into one token), as transformers' PixtralProcessor passes it to the image processor. The arithmetic is that
of transformers' PixtralImageProcessorPil (PIL resize on 8-bit images, rescale in float64 then float32,
normalise in float32), so pixel values agree with it.

A picture of rows x cols tokens (H / patch_size by W / patch_size) stands in the prompt as

    [IMG] * cols [IMG_BREAK]
    [IMG] * cols [IMG_BREAK]
    ...
    [IMG] * cols [IMG_END]            (the last row ends the image instead of breaking the line)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from engine.vision.options import (
    PROCESSOR_CONFIG_NAME,
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

IMAGE_TOKEN = "[IMG]"
IMAGE_BREAK_TOKEN = "[IMG_BREAK]"
IMAGE_END_TOKEN = "[IMG_END]"

_KINDS = tuple(f"PixtralImageProcessor{suffix}" for suffix in ("", "Fast", "Pil"))
# transformers' PixtralImageProcessorPil class defaults.
_DEFAULTS: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"longest_edge": 1024},
    "patch_size": {"height": 16, "width": 16},
    "resample": int(Image.Resampling.BICUBIC),
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": (0.48145466, 0.4578275, 0.40821073),
    "image_std": (0.26862954, 0.26130258, 0.27577711),
}
# do_pad only pads several images of one batch to a common shape; one picture is never padded.
_IGNORED = ("image_processor_type", "processor_class", "do_pad", "auto_map", "default_to_square")
# Options that change the pixels in ways this processor does not implement: refused when enabled.
_UNSUPPORTED = ("do_center_crop",)


@dataclass(frozen=True)
class PixtralImageProcessor:
    """Pixel preprocessing of Pixtral-family models. Build it with `from_folder` or `from_dict`; call it on a
    PIL image to get [3, H, W] float32 with H and W multiples of `patch_size`.

    `max_hw` is the (height, width) box a picture is shrunk to fit (size.longest_edge on both sides, or
    size.height / size.width). `stated_patch_size` is the token patch the folder's processor_config.json
    states (its patch_size times spatial_merge_size), None where it states none; the image token texts
    come from the same file.
    """

    do_convert_rgb: bool
    do_resize: bool
    max_hw: tuple[int, int]
    patch_size: int
    resample: int
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    stated_patch_size: int | None = None
    image_token: str = IMAGE_TOKEN
    image_break_token: str = IMAGE_BREAK_TOKEN
    image_end_token: str = IMAGE_END_TOKEN

    @classmethod
    def from_folder(cls, folder: str | Path, patch_size: int | None = None) -> PixtralImageProcessor:
        """Read a model folder's preprocessor_config.json (or the `image_processor` section of
        processor_config.json) and the processor settings in processor_config.json.

        `patch_size` (the model's encoder patch times its merge factor) overrides the file's, as the
        Pixtral processor overrides its image processor's.
        """
        config, source, combined = read_processor_config(folder, "prepared for the vision encoder")
        return cls.from_dict(config, source=source, patch_size=patch_size, processor=combined)

    @classmethod
    def from_dict(
        cls,
        config: dict[str, Any],
        *,
        source: str = "the processor config",
        patch_size: int | None = None,
        processor: dict[str, Any] | None = None,
    ) -> PixtralImageProcessor:
        """Parse a `preprocessor_config.json` dict; `source` names it in error messages. `processor` is the
        processor_config.json dict (token texts, patch_size, spatial_merge_size) when there is one."""
        opts = processor_options(
            config,
            source,
            family="Pixtral",
            kinds=_KINDS,
            defaults=_DEFAULTS,
            ignored=_IGNORED,
            unsupported=_UNSUPPORTED,
        )
        if patch_size is None:
            patch_size = _parse_patch(opts["patch_size"], source)
        processor = processor or {}
        return cls(
            do_convert_rgb=bool_option(opts, "do_convert_rgb", source),
            do_resize=bool_option(opts, "do_resize", source),
            max_hw=_parse_size(opts["size"], source),
            patch_size=positive_int(patch_size, "patch_size", source),
            resample=resample_code(opts["resample"], source),
            do_rescale=bool_option(opts, "do_rescale", source),
            rescale_factor=positive_float(opts["rescale_factor"], "rescale_factor", source),
            do_normalize=bool_option(opts, "do_normalize", source),
            image_mean=three_numbers(opts["image_mean"], "image_mean", source, positive=False),
            image_std=three_numbers(opts["image_std"], "image_std", source, positive=True),
            stated_patch_size=_stated_patch(processor),
            image_token=_token(processor, "image_token", IMAGE_TOKEN),
            image_break_token=_token(processor, "image_break_token", IMAGE_BREAK_TOKEN),
            image_end_token=_token(processor, "image_end_token", IMAGE_END_TOKEN),
        )

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """Preprocess one image into [3, H, W] float32 (H, W multiples of `patch_size`)."""
        if not isinstance(image, Image.Image):
            raise TypeError(
                f"PixtralImageProcessor takes a PIL.Image.Image, got {type(image).__name__}; "
                "decode files and bytes with engine.vision.image.load_image first"
            )
        image = rgb_for_model(image, self.do_convert_rgb)  # the encoder takes 3 channels whatever the flag says
        height, width = self.output_hw(image.height, image.width)
        if (height, width) != (image.height, image.width):
            image = image.resize((width, height), resample=self.resample)
        return normalised(image, self)

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) of a height x width picture once preprocessed (`resized_hw`, or as it is without
        do_resize), from its size alone."""
        return self.resized_hw(height, width) if self.do_resize else (height, width)

    def resized_hw(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) of a height x width picture after resizing: shrunk (never grown) to fit `max_hw`,
        each side floored, then each side rounded up to whole patches."""
        max_height, max_width = self.max_hw
        ratio = max(height / max_height, width / max_width)
        if ratio > 1:
            height, width = math.floor(height / ratio), math.floor(width / ratio)
        # A sliver (a 1 x 3000 banner) would floor to 0 pixels, where transformers fails; keep one patch.
        patch = self.patch_size
        return max(math.ceil(height / patch), 1) * patch, max(math.ceil(width / patch), 1) * patch

    def grid(self, pixel_values: torch.Tensor) -> tuple[int, int]:
        """(rows, cols) of image tokens of preprocessed `pixel_values` [3, H, W]."""
        return pixel_values.shape[-2] // self.patch_size, pixel_values.shape[-1] // self.patch_size


def image_layout(rows: int, cols: int, image_id: int, break_id: int, end_id: int) -> torch.Tensor:
    """Token ids [rows * (cols + 1)] of a picture of rows x cols image tokens: each row's image tokens then a
    break, the last break being the end token."""
    if rows < 1 or cols < 1:
        raise ValueError(f"a picture has at least one row and one column of image tokens, got {rows} x {cols}")
    row = torch.tensor([image_id] * cols + [break_id], dtype=torch.long)
    ids = row.repeat(rows)
    ids[-1] = end_id
    return ids


def _parse_size(size: Any, source: str) -> tuple[int, int]:
    if isinstance(size, dict) and size.get("longest_edge") is not None:
        edge = positive_int(size["longest_edge"], "size.longest_edge", source)
        return edge, edge
    if isinstance(size, dict) and size.get("height") is not None and size.get("width") is not None:
        return positive_int(size["height"], "size.height", source), positive_int(size["width"], "size.width", source)
    raise ValueError(
        f"{source}: size={size!r} is not supported; use {{'longest_edge': N}} or {{'height': H, 'width': W}}"
    )


def _parse_patch(patch: Any, source: str) -> int:
    if isinstance(patch, dict) and set(patch) == {"height", "width"}:
        if patch["height"] != patch["width"]:
            raise ValueError(f"{source}: patch_size={patch!r} is not square; Pixtral patches are square")
        return positive_int(patch["height"], "patch_size.height", source)
    return positive_int(patch, "patch_size", source)


def _stated_patch(processor: dict[str, Any]) -> int | None:
    """processor_config.json's patch_size times spatial_merge_size (its defaults 16 and 1 where only one is
    stated), or None when it states neither."""
    patch, merge = processor.get("patch_size"), processor.get("spatial_merge_size")
    if patch is None and merge is None:
        return None
    source = PROCESSOR_CONFIG_NAME
    patch = 16 if patch is None else positive_int(patch, "patch_size", source)
    return patch * (1 if merge is None else positive_int(merge, "spatial_merge_size", source))


def _token(processor: dict[str, Any], key: str, default: str) -> str:
    value = processor.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise ValueError(f"{PROCESSOR_CONFIG_NAME}: {key} should be the token's text, got {value!r}")
    return value
