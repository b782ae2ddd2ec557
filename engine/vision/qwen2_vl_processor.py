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

import numpy as np
import torch
from PIL import Image

from engine.errors import ImageError, MissingFileError
from engine.vision.image import to_rgb
from engine.vision.preprocess import (
    CONFIG_NAME,
    PROCESSOR_CONFIG_NAME,
    _bool,
    _parse_resample,
    _positive_float,
    _positive_int,
    _read_json,
    _three,
)

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
        folder = Path(folder)
        if not folder.is_dir():
            raise MissingFileError(f"model folder {folder} does not exist: check the path")
        nested = folder / PROCESSOR_CONFIG_NAME
        if nested.is_file():
            combined = _read_json(nested)
            if isinstance(combined.get("image_processor"), dict):
                return cls.from_dict(combined["image_processor"], source=str(nested))
        path = folder / CONFIG_NAME
        if not path.is_file():
            raise MissingFileError(
                f"{folder} has no {CONFIG_NAME}, so its images cannot be prepared for the vision model: copy "
                f"{CONFIG_NAME} from the model's original repository into the folder"
            )
        return cls.from_dict(_read_json(path), source=str(path))

    @classmethod
    def from_dict(cls, config: dict[str, Any], *, source: str = "the processor config") -> Qwen2VLImageProcessor:
        """Parse a `preprocessor_config.json` dict; `source` names it in error messages.

        Pixel limits come from `size` ({"shortest_edge": min_pixels, "longest_edge": max_pixels}); top-level
        `min_pixels` / `max_pixels`, as released Qwen2-VL configs write them, take precedence (transformers'
        rule).
        """
        if not isinstance(config, dict):
            raise ValueError(f"{source} should be a JSON object of options, got {type(config).__name__}")
        class_name = config.get("image_processor_type")
        if class_name is not None and class_name not in _KINDS:
            raise ValueError(
                f"{source}: image_processor_type {class_name!r} is not a Qwen2-VL image processor; expected one "
                f"of {', '.join(sorted(_KINDS))}"
            )
        unknown = sorted(set(config) - set(_DEFAULTS) - set(_IGNORED))
        if unknown:
            logger.debug("%s: ignoring keys %s", source, unknown)
        if config.get("data_format") not in (None, "channels_first"):
            raise ValueError(f"{source}: data_format={config['data_format']!r} is not supported; use 'channels_first'")
        # None in a config means "use the class default", as transformers treats it.
        opts = {key: _DEFAULTS[key] if config.get(key) is None else config[key] for key in _DEFAULTS}
        size = opts["size"]
        if not isinstance(size, dict) or not {"shortest_edge", "longest_edge"} <= set(size):
            raise ValueError(
                f"{source}: size={size!r} is not supported; use {{'shortest_edge': MIN_PIXELS, 'longest_edge': "
                "MAX_PIXELS}"
            )
        min_pixels = config["min_pixels"] if config.get("min_pixels") is not None else size["shortest_edge"]
        max_pixels = config["max_pixels"] if config.get("max_pixels") is not None else size["longest_edge"]
        min_pixels = _positive_int(min_pixels, "min_pixels (size.shortest_edge)", source)
        max_pixels = _positive_int(max_pixels, "max_pixels (size.longest_edge)", source)
        if min_pixels > max_pixels:
            raise ValueError(f"{source}: min_pixels {min_pixels} is larger than max_pixels {max_pixels}")
        return cls(
            do_convert_rgb=_bool(opts, "do_convert_rgb", source),
            do_resize=_bool(opts, "do_resize", source),
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            resample=_parse_resample(opts["resample"], source),
            do_rescale=_bool(opts, "do_rescale", source),
            rescale_factor=_positive_float(opts["rescale_factor"], "rescale_factor", source),
            do_normalize=_bool(opts, "do_normalize", source),
            image_mean=_three(opts["image_mean"], "image_mean", source, positive=False),
            image_std=_three(opts["image_std"], "image_std", source, positive=True),
            patch_size=_positive_int(opts["patch_size"], "patch_size", source),
            temporal_patch_size=_positive_int(opts["temporal_patch_size"], "temporal_patch_size", source),
            merge_size=_positive_int(opts["merge_size"], "merge_size", source),
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

    def __call__(self, image: Image.Image) -> PatchedImage:
        """Preprocess one image into its patches and grid."""
        if not isinstance(image, Image.Image):
            raise TypeError(
                f"Qwen2VLImageProcessor takes a PIL.Image.Image, got {type(image).__name__}; "
                "decode files and bytes with engine.vision.image.load_image first"
            )
        if self.do_convert_rgb and (image.mode != "RGB" or "transparency" in image.info):
            image = to_rgb(image)
        elif image.mode != "RGB":
            image = image.convert("RGB")  # the vision model takes 3 channels whatever the flag says
        height, width = self.resized_hw(image.height, image.width)
        if height % self.factor or width % self.factor:
            raise ImageError(
                f"the image is {width}x{height} pixels but Qwen2-VL needs sides that are multiples of {self.factor} "
                "(patch_size * merge_size); turn do_resize on in preprocessor_config.json or resize the image"
            )
        if (height, width) != (image.height, image.width):
            image = image.resize((width, height), resample=self.resample)
        pixels = np.asarray(image)  # [H, W, 3] uint8
        if self.do_rescale:
            # float64 product then float32, the order transformers uses, so the values agree to the last bit.
            pixels = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        values = torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32))  # [H, W, 3]
        if self.do_normalize:
            values = (values - torch.tensor(self.image_mean)) / torch.tensor(self.image_std)
        return self._patchify(values.permute(2, 0, 1))

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
