"""Idefics3 / SmolVLM image preprocessing: one picture -> square tiles plus a global view, and its prompt text.

    RGB -> resize (longest edge to `size`, short edge even) -> resize up to multiples of the tile side
        -> cut rows x cols tiles, row by row, then the whole picture squeezed to one tile (the global image)
        -> rescale -> normalise -> [num_tiles, 3, tile, tile] float32

A picture that is already one tile is not cut: rows = cols = 0 and it is its own global image. The
arithmetic is that of transformers' Idefics3ImageProcessorPil / SmolVLMImageProcessorPil (PIL resizes on
8-bit images, rescale in float64 then float32, normalise in float32), so pixel values agree with them.

`image_prompt(rows, cols, tokens_per_tile)` is the text the processor puts where the image goes:

    <fake_token_around_image><row_1_col_1><image>*n ... <fake_token_around_image><row_1_col_C><image>*n \\n
    ...                                                                          (one line per tile row)
    \\n<fake_token_around_image><global-img><image>*n<fake_token_around_image>
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

IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"
# transformers caps the resized picture at 4k per side whatever `size` asks for.
MAX_IMAGE_SIDE = 4096

_KINDS = {
    f"{family}ImageProcessor{suffix}": family for family in ("Idefics3", "SmolVLM") for suffix in ("", "Fast", "Pil")
}
# transformers' class defaults (Idefics3ImageProcessorPil; SmolVLM's are the same).
_DEFAULTS: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"longest_edge": 4 * 364},
    "resample": int(Image.Resampling.LANCZOS),
    "do_image_splitting": True,
    "max_image_size": {"longest_edge": 364},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": (0.5, 0.5, 0.5),
    "image_std": (0.5, 0.5, 0.5),
}
# Keys that describe the file, the batch or videos, not the pixels of one image. do_pad only pads the
# tiles of several images of a batch to one shape; one image's tiles always have the same shape.
_IGNORED = ("image_processor_type", "processor_class", "do_pad", "return_row_col_info", "auto_map")


@dataclass(frozen=True)
class SplitImage:
    """One preprocessed picture: `pixel_values` [num_tiles, 3, tile, tile] (rows*cols tiles row by row, then
    the global image; just the global image when rows = cols = 0)."""

    pixel_values: torch.Tensor
    rows: int
    cols: int

    @property
    def num_tiles(self) -> int:
        return self.pixel_values.shape[0]


@dataclass(frozen=True)
class Idefics3ImageProcessor:
    """Pixel preprocessing of Idefics3 / SmolVLM. Build it with `from_folder` or `from_dict`; call it on a
    PIL image to get a `SplitImage`.

    `longest_edge` (or the exact `resize_hw`) is the first resize; `tile_size` is `max_image_size`'s
    longest edge, the side of every tile. `image_seq_len` is the processor's own count of image tokens
    per tile when its config states one (None otherwise); the model's count is what the prompt uses.
    """

    do_convert_rgb: bool
    do_resize: bool
    longest_edge: int | None
    resize_hw: tuple[int, int] | None
    resample: int
    do_image_splitting: bool
    tile_size: int
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    image_seq_len: int | None = None

    @classmethod
    def from_folder(cls, folder: str | Path) -> Idefics3ImageProcessor:
        """Read the image processor config of a Hugging Face model folder (preprocessor_config.json, or the
        `image_processor` section of processor_config.json; `image_seq_len` from processor_config.json)."""
        config, source, combined = read_processor_config(folder, "cut into tiles for the vision tower")
        return cls.from_dict(config, source=source, image_seq_len=combined.get("image_seq_len"))

    @classmethod
    def from_dict(
        cls, config: dict[str, Any], *, source: str = "the processor config", image_seq_len: Any = None
    ) -> Idefics3ImageProcessor:
        """Parse a `preprocessor_config.json` dict; `source` names it in error messages."""
        opts = processor_options(
            config, source, family="Idefics3 / SmolVLM", kinds=_KINDS, defaults=_DEFAULTS, ignored=_IGNORED
        )
        longest_edge, resize_hw = _parse_size(opts["size"], "size", source)
        tile = opts["max_image_size"]
        if not isinstance(tile, dict) or "longest_edge" not in tile:
            raise ValueError(f"{source}: max_image_size should be {{'longest_edge': N}}, got {tile!r}")
        if image_seq_len is not None:
            image_seq_len = positive_int(image_seq_len, "image_seq_len", source)
        return cls(
            do_convert_rgb=bool_option(opts, "do_convert_rgb", source),
            do_resize=bool_option(opts, "do_resize", source),
            longest_edge=longest_edge,
            resize_hw=resize_hw,
            resample=resample_code(opts["resample"], source),
            do_image_splitting=bool_option(opts, "do_image_splitting", source),
            tile_size=positive_int(tile["longest_edge"], "max_image_size.longest_edge", source),
            do_rescale=bool_option(opts, "do_rescale", source),
            rescale_factor=positive_float(opts["rescale_factor"], "rescale_factor", source),
            do_normalize=bool_option(opts, "do_normalize", source),
            image_mean=three_numbers(opts["image_mean"], "image_mean", source, positive=False),
            image_std=three_numbers(opts["image_std"], "image_std", source, positive=True),
            image_seq_len=image_seq_len,
        )

    def __call__(self, image: Image.Image) -> SplitImage:
        """Preprocess one image into its tiles and global image."""
        if not isinstance(image, Image.Image):
            raise TypeError(
                f"Idefics3ImageProcessor takes a PIL.Image.Image, got {type(image).__name__}; "
                "decode files and bytes with engine.vision.image.load_image first"
            )
        image = rgb_for_model(image, self.do_convert_rgb)  # the tower takes 3 channels whatever the flag says
        if self.do_resize:
            height, width = self.resized_hw(image.height, image.width)
            image = image.resize((width, height), resample=self.resample)
        tile = self.tile_size
        rows, cols = self._split(image.height, image.width)
        if not self.do_image_splitting:
            tiles = [np.asarray(image.resize((tile, tile), resample=self.resample))]
        else:
            height, width = tile_multiple_hw(image.height, image.width, tile)
            image = image.resize((width, height), resample=self.resample)
            pixels = np.asarray(image)  # [H, W, 3] uint8
            tiles = [
                pixels[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile] for r in range(rows) for c in range(cols)
            ]
            # Cut pictures add a squeezed global view; an uncut one is its own global view.
            tiles.append(np.asarray(image.resize((tile, tile), resample=self.resample)) if tiles else pixels)
        return SplitImage(torch.stack([normalised(t, self) for t in tiles]), rows, cols)

    def tile_grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, cols) of tiles a height x width picture is cut into (0, 0: it is only its global image),
        from its size alone."""
        if self.do_resize:
            height, width = self.resized_hw(height, width)
        return self._split(height, width)

    def _split(self, height: int, width: int) -> tuple[int, int]:
        """(rows, cols) of a picture of this size after the first resize."""
        if not self.do_image_splitting:
            return 0, 0
        height, width = tile_multiple_hw(height, width, self.tile_size)
        if height > self.tile_size or width > self.tile_size:
            return height // self.tile_size, width // self.tile_size
        return 0, 0

    def resized_hw(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the first resize of a height x width picture."""
        if self.resize_hw is not None:
            return self.resize_hw
        return longest_edge_hw(height, width, self.longest_edge)


def longest_edge_hw(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """The first resize: the longest side becomes `longest_edge` (up or down), the other keeps the aspect
    ratio truncated and then rounded up to an even number; the result is capped at MAX_IMAGE_SIDE per side."""
    aspect = width / height
    if width >= height:
        width = longest_edge
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest_edge
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    # The cap recomputes the aspect ratio from the resized sides, as transformers does.
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIDE:
        width, height = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE / aspect)
    elif height > width and height > MAX_IMAGE_SIDE:
        height, width = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE * aspect)
    return max(height, 1), max(width, 1)


def tile_multiple_hw(height: int, width: int, tile: int) -> tuple[int, int]:
    """The second resize: both sides up to whole tiles. The longer side is rounded up first; the shorter one
    is derived from it through the aspect ratio and then rounded up (transformers' order)."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def image_prompt(
    rows: int,
    cols: int,
    tokens_per_tile: int,
    *,
    image_token: str = IMAGE_TOKEN,
    fake_token: str = FAKE_IMAGE_TOKEN,
    global_token: str = GLOBAL_IMAGE_TOKEN,
) -> str:
    """The prompt text of one image cut into rows x cols tiles (0 x 0: not cut), `tokens_per_tile` image
    tokens for each tile and for the global image, exactly as the Idefics3 / SmolVLM processors write it."""
    image_run = image_token * tokens_per_tile
    text = ""
    for r in range(rows):
        text += "".join(f"{fake_token}<row_{r + 1}_col_{c + 1}>{image_run}" for c in range(cols)) + "\n"
    if rows or cols:
        text += "\n"
    return text + f"{fake_token}{global_token}{image_run}{fake_token}"


def _parse_size(size: Any, key: str, source: str) -> tuple[int | None, tuple[int, int] | None]:
    """`size` as (longest_edge, None) or (None, (height, width))."""
    if isinstance(size, dict) and "longest_edge" in size:
        return positive_int(size["longest_edge"], f"{key}.longest_edge", source), None
    if isinstance(size, dict) and {"height", "width"} <= set(size):
        height = positive_int(size["height"], f"{key}.height", source)
        return None, (height, positive_int(size["width"], f"{key}.width", source))
    raise ValueError(
        f"{source}: {key}={size!r} is not supported; use {{'longest_edge': N}} or {{'height': H, 'width': W}}"
    )
