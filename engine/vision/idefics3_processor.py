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

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from engine.errors import CorruptFileError, MissingFileError
from engine.vision.image import to_rgb
from engine.vision.preprocess import CONFIG_NAME, PROCESSOR_CONFIG_NAME

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
_PIL_RESAMPLE_CODES = {int(r) for r in Image.Resampling}


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
        folder = Path(folder)
        if not folder.is_dir():
            raise MissingFileError(f"model folder {folder} does not exist: check the path")
        combined: dict[str, Any] = {}
        if (folder / PROCESSOR_CONFIG_NAME).is_file():
            combined = _read_json(folder / PROCESSOR_CONFIG_NAME)
        seq_len = combined.get("image_seq_len")
        if isinstance(combined.get("image_processor"), dict):
            source = str(folder / PROCESSOR_CONFIG_NAME)
            return cls.from_dict(combined["image_processor"], source=source, image_seq_len=seq_len)
        path = folder / CONFIG_NAME
        if not path.is_file():
            raise MissingFileError(
                f"{folder} has no {CONFIG_NAME}, so its images cannot be cut into tiles for the vision "
                f"tower: copy {CONFIG_NAME} from the model's original repository into the folder"
            )
        return cls.from_dict(_read_json(path), source=str(path), image_seq_len=seq_len)

    @classmethod
    def from_dict(
        cls, config: dict[str, Any], *, source: str = "the processor config", image_seq_len: Any = None
    ) -> Idefics3ImageProcessor:
        """Parse a `preprocessor_config.json` dict; `source` names it in error messages."""
        if not isinstance(config, dict):
            raise ValueError(f"{source} should be a JSON object of options, got {type(config).__name__}")
        class_name = config.get("image_processor_type")
        if class_name is not None and class_name not in _KINDS:
            raise ValueError(
                f"{source}: image_processor_type {class_name!r} is not an Idefics3 or SmolVLM image processor; "
                f"expected one of {', '.join(sorted(_KINDS))}"
            )
        unknown = sorted(set(config) - set(_DEFAULTS) - set(_IGNORED))
        if unknown:
            logger.debug("%s: ignoring keys %s", source, unknown)
        # None in a config means "use the class default", as transformers treats it.
        opts = {key: _DEFAULTS[key] if config.get(key) is None else config[key] for key in _DEFAULTS}
        data_format = config.get("data_format")
        if data_format not in (None, "channels_first"):
            raise ValueError(f"{source}: data_format={data_format!r} is not supported; use 'channels_first'")

        longest_edge, resize_hw = _parse_size(opts["size"], "size", source)
        tile = opts["max_image_size"]
        if not isinstance(tile, dict) or "longest_edge" not in tile:
            raise ValueError(f"{source}: max_image_size should be {{'longest_edge': N}}, got {tile!r}")
        if image_seq_len is not None:
            image_seq_len = _positive_int(image_seq_len, "image_seq_len", source)
        return cls(
            do_convert_rgb=_bool(opts, "do_convert_rgb", source),
            do_resize=_bool(opts, "do_resize", source),
            longest_edge=longest_edge,
            resize_hw=resize_hw,
            resample=_parse_resample(opts["resample"], source),
            do_image_splitting=_bool(opts, "do_image_splitting", source),
            tile_size=_positive_int(tile["longest_edge"], "max_image_size.longest_edge", source),
            do_rescale=_bool(opts, "do_rescale", source),
            rescale_factor=_positive_float(opts["rescale_factor"], "rescale_factor", source),
            do_normalize=_bool(opts, "do_normalize", source),
            image_mean=_three(opts["image_mean"], "image_mean", source, positive=False),
            image_std=_three(opts["image_std"], "image_std", source, positive=True),
            image_seq_len=image_seq_len,
        )

    def __call__(self, image: Image.Image) -> SplitImage:
        """Preprocess one image into its tiles and global image."""
        if not isinstance(image, Image.Image):
            raise TypeError(
                f"Idefics3ImageProcessor takes a PIL.Image.Image, got {type(image).__name__}; "
                "decode files and bytes with engine.vision.image.load_image first"
            )
        if self.do_convert_rgb and (image.mode != "RGB" or "transparency" in image.info):
            image = to_rgb(image)
        elif image.mode != "RGB":
            image = image.convert("RGB")  # the tower takes 3 channels whatever the flag says
        if self.do_resize:
            height, width = self.resized_hw(image.height, image.width)
            image = image.resize((width, height), resample=self.resample)
        tile = self.tile_size
        rows = cols = 0
        if not self.do_image_splitting:
            tiles = [np.asarray(image.resize((tile, tile), resample=self.resample))]
        else:
            height, width = tile_multiple_hw(image.height, image.width, tile)
            image = image.resize((width, height), resample=self.resample)
            pixels = np.asarray(image)  # [H, W, 3] uint8
            if height > tile or width > tile:
                rows, cols = height // tile, width // tile
                tiles = [
                    pixels[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile]
                    for r in range(rows)
                    for c in range(cols)
                ]
                tiles.append(np.asarray(image.resize((tile, tile), resample=self.resample)))
            else:
                tiles = [pixels]
        return SplitImage(torch.stack([self._normalised(t) for t in tiles]), rows, cols)

    def resized_hw(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the first resize of a height x width picture."""
        if self.resize_hw is not None:
            return self.resize_hw
        return longest_edge_hw(height, width, self.longest_edge)

    def _normalised(self, pixels: np.ndarray) -> torch.Tensor:
        """[H, W, 3] uint8 -> [3, H, W] float32, rescaled and normalised."""
        if self.do_rescale:
            # float64 product then float32, the order transformers uses, so the values agree to the last bit.
            pixels = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        values = torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32))
        if self.do_normalize:
            mean = torch.tensor(self.image_mean, dtype=torch.float32)
            std = torch.tensor(self.image_std, dtype=torch.float32)
            values = (values - mean) / std
        return values.permute(2, 0, 1).contiguous()


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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"{path} is not valid JSON ({exc}): re-download it") from None
    if not isinstance(config, dict):
        raise CorruptFileError(f"{path} should hold a JSON object, found {type(config).__name__}: re-download it")
    return config


def _parse_size(size: Any, key: str, source: str) -> tuple[int | None, tuple[int, int] | None]:
    """`size` as (longest_edge, None) or (None, (height, width))."""
    if isinstance(size, dict) and "longest_edge" in size:
        return _positive_int(size["longest_edge"], f"{key}.longest_edge", source), None
    if isinstance(size, dict) and {"height", "width"} <= set(size):
        height = _positive_int(size["height"], f"{key}.height", source)
        return None, (height, _positive_int(size["width"], f"{key}.width", source))
    raise ValueError(
        f"{source}: {key}={size!r} is not supported; use {{'longest_edge': N}} or {{'height': H, 'width': W}}"
    )


def _bool(opts: dict[str, Any], key: str, source: str) -> bool:
    value = opts[key]
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {key} should be true or false, got {value!r}")
    return value


def _positive_int(value: Any, key: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{source}: {key} should be a positive whole number, got {value!r}")
    return value


def _positive_float(value: Any, key: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{source}: {key} should be a positive number, got {value!r}")
    return float(value)


def _parse_resample(value: Any, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in _PIL_RESAMPLE_CODES:
        raise ValueError(f"{source}: resample={value!r} is not a PIL resampling code (0-5; 1 is LANCZOS)")
    return value


def _three(value: Any, key: str, source: str, *, positive: bool) -> tuple[float, float, float]:
    numbers = [value] * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if (
        not isinstance(numbers, (list, tuple))
        or len(numbers) != 3
        or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers)
        or (positive and not all(x > 0 for x in numbers))
    ):
        need = "three positive numbers" if positive else "three numbers"
        raise ValueError(f"{source}: {key} should be one number or {need} (R, G, B), got {value!r}")
    return float(numbers[0]), float(numbers[1]), float(numbers[2])
