"""`ImageProcessor`: turns RGB images into the normalised pixel tensors a CLIP or SigLIP vision tower expects.

Parsed once from a model folder's `preprocessor_config.json` into a frozen dataclass, then applied as

    to RGB -> resize (PIL) -> centre crop -> rescale -> normalise -> [3, H, W] float32

with the same arithmetic as transformers' PIL image processors (resize and crop on 8-bit images, rescale
in float64 then cast to float32, normalise in float32), so pixel values agree with the reference.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from engine.vision.options import (
    bool_option,
    positive_float,
    positive_int,
    read_processor_config,
    resample_code,
    three_numbers,
)
from engine.vision.pixels import normalised, rgb_for_model

logger = logging.getLogger(__name__)

_OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_HALF = (0.5, 0.5, 0.5)
_BICUBIC = int(Image.Resampling.BICUBIC)

# The defaults each supported processor class applies to keys its config leaves out (transformers'
# class attributes for CLIPImageProcessor and SiglipImageProcessor).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "clip": {
        "do_resize": True,
        "size": {"shortest_edge": 224},
        "resample": _BICUBIC,
        "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _OPENAI_CLIP_MEAN,
        "image_std": _OPENAI_CLIP_STD,
        "do_convert_rgb": True,
        "default_to_square": False,
    },
    "siglip": {
        "do_resize": True,
        "size": {"height": 224, "width": 224},
        "resample": _BICUBIC,
        "do_center_crop": False,
        "crop_size": None,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _HALF,
        "image_std": _HALF,
        "do_convert_rgb": True,
        "default_to_square": False,
    },
    # Gemma3ImageProcessor: SigLIP's steps with bilinear resizing (pan-and-scan crops are refused below).
    "gemma3": {
        "do_resize": True,
        "size": {"height": 224, "width": 224},
        "resample": int(Image.Resampling.BILINEAR),
        "do_center_crop": False,
        "crop_size": None,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _HALF,
        "image_std": _HALF,
        "do_convert_rgb": True,
        "default_to_square": True,
    },
}

# Class names as they appear in configs (transformers 4 and 5, fast/PIL variants, old feature extractors).
_KINDS = {
    "CLIPImageProcessor": "clip",
    "CLIPImageProcessorFast": "clip",
    "CLIPImageProcessorPil": "clip",
    "CLIPFeatureExtractor": "clip",
    "SiglipImageProcessor": "siglip",
    "SiglipImageProcessorFast": "siglip",
    "SiglipImageProcessorPil": "siglip",
    "Gemma3ImageProcessor": "gemma3",
    "Gemma3ImageProcessorFast": "gemma3",
    "Gemma3ImageProcessorPil": "gemma3",
}

# Options that change the pixels in ways this processor does not implement: refused when enabled,
# because silently skipping them would feed the model images it was not trained on.
_UNSUPPORTED = (
    "do_pad",
    "use_square_size",
    "do_image_splitting",
    "image_grid_pinpoints",
    "max_image_tiles",
    "do_crop_margin",
    "do_thumbnail",
    "do_align_long_axis",
    "crop_pct",
    "do_flip_channel_order",
    "do_reduce_labels",
    "min_pixels",
    "max_pixels",
    "do_pan_and_scan",
)
# Keys that describe the config or the call, not the pixels.
_IGNORED = (
    "image_processor_type",
    "feature_extractor_type",
    "processor_class",
    "return_tensors",
    "device",
    "input_data_format",
    "disable_grouping",
    "image_seq_length",
    "pad_size",
)


@dataclass(frozen=True)
class ImageProcessor:
    """Pixel preprocessing of a CLIP- or SigLIP-style vision tower.

    Build it with `from_folder` or `from_dict`; `processor(image)` gives a [3, H, W] float32 tensor
    and `processor.batch(images)` a [N, 3, H, W] one. Resizing is either to `shortest_edge` (aspect
    kept, long edge truncated like transformers does) or to exactly `resize_hw` (height, width).
    """

    kind: str
    do_resize: bool
    shortest_edge: int | None
    resize_hw: tuple[int, int] | None
    resample: int
    do_center_crop: bool
    crop_hw: tuple[int, int] | None
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    do_convert_rgb: bool

    @classmethod
    def from_folder(cls, folder: str | Path) -> ImageProcessor:
        """Read the image processor config of a Hugging Face model folder."""
        config, source, _ = read_processor_config(folder, "prepared for the vision tower")
        return cls.from_dict(config, source=source)

    @classmethod
    def from_dict(cls, config: dict[str, Any], *, source: str = "the processor config") -> ImageProcessor:
        """Parse a `preprocessor_config.json` dict; `source` names it in error messages."""
        if not isinstance(config, dict):
            raise ValueError(f"{source} should be a JSON object of options, got {type(config).__name__}")
        type_key = "image_processor_type" if "image_processor_type" in config else "feature_extractor_type"
        class_name = config.get(type_key)
        if class_name is None:
            raise ValueError(
                f"{source} has no 'image_processor_type': add one, e.g. "
                '"image_processor_type": "CLIPImageProcessor" or "SiglipImageProcessor"'
            )
        kind = _KINDS.get(class_name) if isinstance(class_name, str) else None
        if kind is None:
            raise ValueError(
                f"{source}: {type_key} {class_name!r} is not supported; Tandem prepares images for "
                f"{', '.join(sorted(_KINDS))}"
            )
        auto_map = config.get("auto_map")
        if isinstance(auto_map, dict) and "AutoImageProcessor" in auto_map:
            raise ValueError(
                f"{source}: 'auto_map' names a custom image processor ({auto_map['AutoImageProcessor']!r}) "
                "whose code Tandem does not run; use a model with a standard CLIP or SigLIP processor"
            )
        for key in _UNSUPPORTED:
            if config.get(key):
                raise ValueError(
                    f"{source}: {key}={config[key]!r} is not supported by Tandem's {kind} image processor "
                    "(skipping it would change the pixels the model was trained on); use a model without it"
                )
        data_format = config.get("data_format")
        if data_format not in (None, "channels_first"):
            raise ValueError(f"{source}: data_format={data_format!r} is not supported; use 'channels_first'")
        unknown = sorted(set(config) - set(_DEFAULTS[kind]) - set(_IGNORED) - {"auto_map", "data_format"})
        if unknown:
            # transformers ignores these too for CLIP/SigLIP; say so in the log in case one matters.
            logger.debug("%s: ignoring keys %s", source, unknown)

        # None in a config means "use the class default", as transformers treats it.
        opts = {key: config.get(key) for key in _DEFAULTS[kind]}
        opts = {key: (value if value is not None else _DEFAULTS[kind][key]) for key, value in opts.items()}

        do_resize = bool_option(opts, "do_resize", source)
        shortest_edge, resize_hw = None, None
        if do_resize:
            shortest_edge, resize_hw = _parse_size(opts["size"], bool(opts["default_to_square"]), source)
        do_center_crop = bool_option(opts, "do_center_crop", source)
        crop_hw = None
        if do_center_crop:
            if opts["crop_size"] is None:
                raise ValueError(f"{source}: do_center_crop is true but crop_size is missing; add crop_size")
            crop_hw = _parse_crop(opts["crop_size"], source)
        return cls(
            kind=kind,
            do_resize=do_resize,
            shortest_edge=shortest_edge,
            resize_hw=resize_hw,
            resample=resample_code(opts["resample"], source),
            do_center_crop=do_center_crop,
            crop_hw=crop_hw,
            do_rescale=bool_option(opts, "do_rescale", source),
            rescale_factor=positive_float(opts["rescale_factor"], "rescale_factor", source),
            do_normalize=bool_option(opts, "do_normalize", source),
            image_mean=three_numbers(opts["image_mean"], "image_mean", source, positive=False),
            image_std=three_numbers(opts["image_std"], "image_std", source, positive=True),
            do_convert_rgb=bool_option(opts, "do_convert_rgb", source),
        )

    @property
    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of every output, or None when it follows the input (no crop, no fixed resize)."""
        if self.do_center_crop:
            return self.crop_hw
        if self.do_resize and self.resize_hw is not None:
            return self.resize_hw
        return None

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """Preprocess one image into a [3, H, W] float32 tensor."""
        if not isinstance(image, Image.Image):
            raise TypeError(
                f"ImageProcessor takes a PIL.Image.Image, got {type(image).__name__}; "
                "decode files and bytes with engine.vision.image.load_image first"
            )
        # The vision tower takes 3 channels whatever the flag says.
        image = rgb_for_model(image, self.do_convert_rgb)
        if self.do_resize:
            height, width = self._resized_hw(image.height, image.width)
            image = image.resize((width, height), resample=self.resample)
        if self.do_center_crop:
            image = _center_crop(image, self.crop_hw)
        return normalised(image, self)  # [3, H, W]

    def batch(self, images: list[Image.Image]) -> torch.Tensor:
        """Preprocess several images into one [N, 3, H, W] float32 tensor (all must end the same size)."""
        if len(images) == 0:
            raise ValueError("ImageProcessor.batch needs at least one image")
        tensors = [self(image) for image in images]
        shapes = {tuple(t.shape[1:]) for t in tensors}
        if len(shapes) > 1:
            raise ValueError(
                f"the preprocessed images have different sizes {sorted(shapes)} (this config has no fixed "
                "output size); preprocess them one at a time"
            )
        return torch.stack(tensors)

    def _resized_hw(self, height: int, width: int) -> tuple[int, int]:
        if self.resize_hw is not None:
            return self.resize_hw
        # Shortest edge to N, long edge N * long / short truncated toward zero (torchvision's rule, which
        # transformers follows); evaluated in the same order so the float rounding matches.
        target = self.shortest_edge
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(target * long / short)
        return (new_long, target) if width <= height else (target, new_long)


def _center_crop(image: Image.Image, crop_hw: tuple[int, int]) -> Image.Image:
    # Floor division puts the window's top-left at (size - crop) // 2; when the crop is larger than
    # the image the offset is negative and PIL fills outside with zeros, which matches transformers'
    # zero padding (image placed at ceil((crop - size) / 2)).
    crop_height, crop_width = crop_hw
    top = (image.height - crop_height) // 2
    left = (image.width - crop_width) // 2
    return image.crop((left, top, left + crop_width, top + crop_height))


def _parse_size(size: Any, default_to_square: bool, source: str) -> tuple[int | None, tuple[int, int] | None]:
    """`size` as (shortest_edge, None) or (None, (height, width)), read the way transformers reads it."""
    if isinstance(size, int) and not isinstance(size, bool):
        # A bare number means a square when default_to_square, else the shortest edge.
        side = positive_int(size, "size", source)
        return (None, (side, side)) if default_to_square else (side, None)
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return None, (positive_int(size[0], "size[0]", source), positive_int(size[1], "size[1]", source))
    if isinstance(size, dict) and set(size) == {"shortest_edge"}:
        return positive_int(size["shortest_edge"], "size.shortest_edge", source), None
    if isinstance(size, dict) and set(size) == {"height", "width"}:
        height = positive_int(size["height"], "size.height", source)
        return None, (height, positive_int(size["width"], "size.width", source))
    raise ValueError(
        f"{source}: size={size!r} is not supported; use {{'shortest_edge': N}} or {{'height': H, 'width': W}}"
    )


def _parse_crop(crop: Any, source: str) -> tuple[int, int]:
    if isinstance(crop, int) and not isinstance(crop, bool):
        side = positive_int(crop, "crop_size", source)
        return side, side
    if isinstance(crop, (list, tuple)) and len(crop) == 2:
        return positive_int(crop[0], "crop_size[0]", source), positive_int(crop[1], "crop_size[1]", source)
    if isinstance(crop, dict) and set(crop) == {"height", "width"}:
        return (
            positive_int(crop["height"], "crop_size.height", source),
            positive_int(crop["width"], "crop_size.width", source),
        )
    raise ValueError(f"{source}: crop_size={crop!r} is not supported; use {{'height': H, 'width': W}}")
