"""Qwen2-VL / Qwen2.5-VL image preprocessing against transformers' Qwen2VLImageProcessorPil: pixel values and patch
grids of varied images (resized up and down), smart_resize on many sizes, config files, and bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from PIL import Image, ImageDraw
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as reference_smart_resize

from engine.errors import CorruptFileError, ImageError, MissingFileError
from engine.models.qwen2_vl.processor import Qwen2VLImageProcessor, smart_resize

CONFIGS = {
    "tiny-patches": dict(patch_size=4, merge_size=2, min_pixels=256, max_pixels=1920),
    "defaults": dict(),
    "merge3-bilinear": dict(
        patch_size=7, merge_size=3, temporal_patch_size=1, min_pixels=2000, max_pixels=9000, resample=2
    ),
    "no-normalize": dict(patch_size=4, merge_size=2, min_pixels=64, max_pixels=4096, do_normalize=False),
    "no-rescale": dict(
        patch_size=4,
        merge_size=2,
        min_pixels=64,
        max_pixels=4096,
        do_rescale=False,
        image_mean=[120.0, 127.5, 100.0],
        image_std=[60.0, 70.0, 50.0],
    ),
}


def _noise(width: int, height: int, seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    ImageDraw.Draw(img).ellipse((0, 0, width // 2, height // 2), fill="orange")
    return img if mode == "RGB" else img.convert(mode)


def _transparent() -> Image.Image:
    img = _noise(33, 21, 7).convert("RGBA")
    alpha = Image.new("L", img.size, 0)
    ImageDraw.Draw(alpha).rectangle((4, 4, 20, 15), fill=255)
    img.putalpha(alpha)
    return img


IMAGES = {
    "large-333x517": _noise(517, 333, 1),  # scaled down to max_pixels
    "wide-900x10": _noise(900, 10, 2),  # 90:1, one block high
    "tall-17x61": _noise(17, 61, 3),
    "tiny-7x5": _noise(7, 5, 4),  # scaled up to min_pixels
    "one-pixel": _noise(1, 1, 5),
    "exact-multiple-56x112": _noise(56, 112, 6),
    "rgba": _transparent(),
    "grey": _noise(30, 37, 9, mode="L"),
    "palette": _noise(27, 19, 10, mode="P"),
}


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_pixel_values_and_grids_match_transformers(config_name):
    config = CONFIGS[config_name]
    reference = transformers.Qwen2VLImageProcessorPil(**config)
    ours = Qwen2VLImageProcessor.from_dict({"image_processor_type": "Qwen2VLImageProcessor", **config})
    for name, img in IMAGES.items():
        expected = reference(img, return_tensors="pt")
        got = ours(img)
        assert got.grid_thw == tuple(expected["image_grid_thw"][0].tolist()), name
        torch.testing.assert_close(got.pixel_values, expected["pixel_values"], atol=1e-5, rtol=0, msg=name)


def test_resize_goes_up_and_down_to_the_pixel_limits():
    ours = Qwen2VLImageProcessor.from_dict(CONFIGS["tiny-patches"])
    t, h, w = ours(IMAGES["tiny-7x5"]).grid_thw
    assert t == 1 and h * w * 16 >= 256  # scaled up: at least min_pixels
    t, h, w = ours(IMAGES["large-333x517"]).grid_thw
    assert h * w * 16 <= 1920 and (h, w) == (8, 12)  # scaled down: at most max_pixels, aspect kept


def test_smart_resize_matches_transformers_on_many_sizes():
    sizes = [(h, w) for h in (1, 2, 3, 7, 13, 14, 27, 28, 29, 55, 56, 100, 333, 999, 2048) for w in (1, 5, 28, 41, 640)]
    sizes += [(28 * 7 + 14, 28 * 3 + 14), (42, 42), (70, 14)]  # halves: Python's round goes to even
    for factor, lo, hi in ((28, 56 * 56, 28 * 28 * 1280), (8, 256, 1920), (14, 1, 10**7)):
        for h, w in sizes:
            if max(h, w) > 200 * min(h, w):
                continue
            assert smart_resize(h, w, factor, lo, hi) == reference_smart_resize(h, w, factor, lo, hi), (h, w, factor)


@pytest.mark.parametrize("size", [(201, 1), (1, 4000), (0, 5)], ids=["201:1", "1:4000", "zero-side"])
def test_unusable_shapes_are_image_errors(size):
    with pytest.raises(ImageError, match="crop it|no pixels"):
        smart_resize(*size, 28, 56 * 56, 28 * 28 * 1280)
    if min(size) > 0:  # transformers refuses them too
        with pytest.raises(ValueError, match="aspect ratio"):
            reference_smart_resize(*size, 28, 56 * 56, 28 * 28 * 1280)


def test_folder_configs_as_transformers_saves_them_and_as_released(tmp_path):
    saved = tmp_path / "saved"
    transformers.Qwen2VLImageProcessorPil(**CONFIGS["tiny-patches"]).save_pretrained(saved)
    assert "size" in json.loads((saved / "preprocessor_config.json").read_text())
    assert Qwen2VLImageProcessor.from_folder(saved) == Qwen2VLImageProcessor.from_dict(CONFIGS["tiny-patches"])

    # Qwen/Qwen2-VL-7B-Instruct's preprocessor_config.json: min/max pixels at the top level, no size.
    released = {
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
    }
    folder = tmp_path / "released"
    folder.mkdir()
    (folder / "preprocessor_config.json").write_text(json.dumps(released))
    ours = Qwen2VLImageProcessor.from_folder(folder)
    assert (ours.min_pixels, ours.max_pixels) == (3136, 12845056)
    reference = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
    img = IMAGES["large-333x517"]
    expected = reference(img, return_tensors="pt")
    assert ours(img).grid_thw == tuple(expected["image_grid_thw"][0].tolist())
    torch.testing.assert_close(ours(img).pixel_values, expected["pixel_values"], atol=1e-5, rtol=0)

    # Newer folders: one processor_config.json with the image processor nested.
    nested = tmp_path / "nested"
    nested.mkdir()
    (nested / "processor_config.json").write_text(json.dumps({"image_processor": released}))
    assert Qwen2VLImageProcessor.from_folder(nested) == ours


def test_missing_and_broken_files_are_named(tmp_path):
    with pytest.raises(MissingFileError, match="does not exist"):
        Qwen2VLImageProcessor.from_folder(tmp_path / "nope")
    with pytest.raises(MissingFileError, match="preprocessor_config.json"):
        Qwen2VLImageProcessor.from_folder(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(CorruptFileError, match="not valid JSON"):
        Qwen2VLImageProcessor.from_folder(tmp_path)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"image_processor_type": "CLIPImageProcessor"}, "not a Qwen2-VL image processor"),
        ({"min_pixels": 5000, "max_pixels": 4000}, "min_pixels 5000 is larger than max_pixels 4000"),
        ({"size": {"height": 224, "width": 224}}, "size=.* is not supported"),
        ({"max_pixels": -1}, "max_pixels .* should be a positive whole number"),
        ({"patch_size": 0}, "patch_size should be a positive whole number"),
        ({"do_resize": "yes"}, "do_resize should be true or false"),
        ({"image_std": [0.5, 0.0, 0.5]}, "image_std should be"),
        ({"resample": 9}, "resample=9 is not a PIL resampling code"),
        ({"data_format": "channels_last"}, "data_format='channels_last' is not supported"),
    ],
)
def test_bad_config_values_are_named(config, message):
    with pytest.raises(ValueError, match=message):
        Qwen2VLImageProcessor.from_dict(config, source="preprocessor_config.json")


def test_unresized_image_must_fit_the_grid():
    ours = Qwen2VLImageProcessor.from_dict({**CONFIGS["tiny-patches"], "do_resize": False})
    assert ours(_noise(16, 24, 1)).grid_thw == (1, 6, 4)
    with pytest.raises(ImageError, match="multiples of 8"):
        ours(_noise(17, 24, 1))


def test_only_pil_images_are_taken():
    with pytest.raises(TypeError, match="PIL.Image.Image"):
        Qwen2VLImageProcessor.from_dict({})(np.zeros((8, 8, 3), dtype=np.uint8))
