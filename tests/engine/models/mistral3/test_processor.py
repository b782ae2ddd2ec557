"""Pixtral / Mistral 3 preprocessing against transformers' PixtralImageProcessorPil (pixel values and sizes on
varied pictures and configs, the processor's patch override), reading model folders, the [IMG] / [IMG_BREAK] /
[IMG_END] layout, and the errors for bad configs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from PIL import Image, ImageDraw

from engine.errors import CorruptFileError, MissingFileError
from engine.models.mistral3.processor import PixtralImageProcessor, image_layout

CONFIGS = {
    "default-patch": dict(size={"longest_edge": 64}),
    # Mistral 3's shape: 14 px patches merged 2 x 2, so pictures go to multiples of 28.
    "mistral3": dict(size={"longest_edge": 70}, patch_size={"height": 28, "width": 28}),
    "box": dict(size={"height": 40, "width": 72}, patch_size={"height": 8, "width": 8}),
    "bilinear-raw": dict(size={"longest_edge": 45}, patch_size=5, resample=2, do_normalize=False),
    "no-rescale": dict(
        size={"longest_edge": 32},
        patch_size=8,
        do_rescale=False,
        image_mean=[120.0, 127.5, 100.0],
        image_std=[60.0, 70.0, 50.0],
    ),
    "no-resize": dict(do_resize=False, patch_size=4),
}


def _noise(size: tuple[int, int], seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    ImageDraw.Draw(img).ellipse((0, 0, size[0] // 2, size[1] // 2), fill="orange")
    return img if mode == "RGB" else img.convert(mode)


def _transparent() -> Image.Image:
    img = _noise((33, 21), 7).convert("RGBA")
    alpha = Image.new("L", img.size, 0)
    ImageDraw.Draw(alpha).rectangle((4, 4, 20, 15), fill=255)
    img.putalpha(alpha)
    return img


IMAGES = {
    "wide": _noise((161, 37), 1),  # shrunk, the short side floored
    "tall": _noise((23, 150), 2),
    "tiny": _noise((5, 3), 3),  # grown up to one patch
    "square-exact": _noise((64, 64), 4),
    "odd": _noise((33, 17), 5),
    "grey": _noise((40, 30), 6, "L"),
    "palette": _noise((41, 29), 8, "P"),
    "transparent": _transparent(),
}


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_pixels_match_transformers(config_name):
    reference = transformers.PixtralImageProcessorPil(**CONFIGS[config_name])
    ours = PixtralImageProcessor.from_dict(reference.to_dict())
    for name, img in IMAGES.items():
        ref = reference(images=[img], return_tensors="pt")
        got = ours(img)
        assert tuple(ref["image_sizes"][0].tolist()) == tuple(got.shape[1:]), name
        torch.testing.assert_close(got, ref["pixel_values"][0], atol=1e-5, rtol=0, msg=f"{config_name}: {name}")
        if CONFIGS[config_name].get("do_resize", True):
            assert got.shape[1] % ours.patch_size == 0 and got.shape[2] % ours.patch_size == 0


def test_patch_override_matches_the_processor_passing_its_patch():
    # transformers' PixtralProcessor hands patch_size * spatial_merge_size to the image processor per call.
    reference = transformers.PixtralImageProcessorPil(size={"longest_edge": 50})
    ours = PixtralImageProcessor.from_dict(reference.to_dict(), patch_size=12)
    assert ours.patch_size == 12
    for name, img in IMAGES.items():
        ref = reference(images=[img], patch_size=12, return_tensors="pt")
        torch.testing.assert_close(ours(img), ref["pixel_values"][0], atol=1e-5, rtol=0, msg=name)


def test_resized_sizes_follow_the_rule():
    ours = PixtralImageProcessor.from_dict({"size": {"longest_edge": 64}, "patch_size": 16})
    assert ours.resized_hw(37, 161) == (16, 64)  # 37 / (161 / 64) = 14.7 -> 14 -> one patch row
    assert ours.resized_hw(3, 5) == (16, 16)  # never shrunk below a patch, grown to one
    assert ours.resized_hw(64, 64) == (64, 64)
    # A sliver floors to 0 pixels, where transformers fails; it keeps one patch here.
    assert ours.resized_hw(1, 3000) == (16, 64)
    assert ours.grid(torch.zeros(3, 48, 80)) == (3, 5)


def test_layout_rows_break_and_end():
    i, b, e = 10, 12, 13
    assert image_layout(2, 3, i, b, e).tolist() == [i, i, i, b, i, i, i, e]
    assert image_layout(1, 1, i, b, e).tolist() == [i, e]
    assert image_layout(3, 1, i, b, e).tolist() == [i, b, i, b, i, e]
    for rows, cols in ((0, 2), (2, 0)):
        with pytest.raises(ValueError, match="at least one row"):
            image_layout(rows, cols, i, b, e)


def test_from_folder_reads_transformers_files(tmp_path):
    reference = transformers.PixtralImageProcessorPil(size={"longest_edge": 40}, patch_size=8)
    reference.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "preprocessor_config.json").read_text())["image_processor_type"].startswith("Pixtral")
    plain = PixtralImageProcessor.from_folder(tmp_path)
    assert (plain.patch_size, plain.max_hw, plain.stated_patch_size) == (8, (40, 40), None)
    assert (plain.image_token, plain.image_break_token, plain.image_end_token) == (
        "[IMG]",
        "[IMG_BREAK]",
        "[IMG_END]",
    )
    img = IMAGES["wide"]
    torch.testing.assert_close(plain(img), reference(images=[img], return_tensors="pt")["pixel_values"][0])
    # A Mistral 3 folder: the processor states its patch and merge and names the tokens.
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"patch_size": 4, "spatial_merge_size": 2, "image_break_token": "<brk>", "image_end_token": "<e>"})
    )
    merged = PixtralImageProcessor.from_folder(tmp_path, patch_size=8)
    assert (merged.patch_size, merged.stated_patch_size) == (8, 8)
    assert (merged.image_break_token, merged.image_end_token) == ("<brk>", "<e>")
    # Newer transformers save the image processor inside processor_config.json.
    (tmp_path / "preprocessor_config.json").unlink()
    nested = {"image_processor": reference.to_dict(), "patch_size": 8}
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    inner = PixtralImageProcessor.from_folder(tmp_path)
    assert (inner.max_hw, inner.stated_patch_size) == ((40, 40), 8)


def test_folder_problems_are_named(tmp_path):
    with pytest.raises(MissingFileError, match="does not exist"):
        PixtralImageProcessor.from_folder(tmp_path / "nowhere")
    with pytest.raises(MissingFileError, match="preprocessor_config.json"):
        PixtralImageProcessor.from_folder(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(CorruptFileError, match="not valid JSON"):
        PixtralImageProcessor.from_folder(tmp_path)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"image_processor_type": "CLIPImageProcessor"}, "'CLIPImageProcessor' is not a Pixtral"),
        ({"size": {"shortest_edge": 10}}, "size="),
        ({"size": {"longest_edge": 0}}, "size.longest_edge"),
        ({"patch_size": {"height": 16, "width": 14}}, "not square"),
        ({"patch_size": "16"}, "patch_size"),
        ({"do_center_crop": True}, "do_center_crop"),
        ({"resample": 9}, "resample=9"),
        ({"image_std": [0.0, 1.0, 1.0]}, "image_std"),
        ({"do_resize": "yes"}, "do_resize"),
    ],
)
def test_bad_configs_are_named(config, message):
    with pytest.raises(ValueError, match=message):
        PixtralImageProcessor.from_dict(config, source="cfg.json")


@pytest.mark.parametrize(
    "processor, message",
    [({"image_break_token": 5}, "image_break_token"), ({"spatial_merge_size": 0}, "spatial_merge_size")],
)
def test_bad_processor_settings_are_named(processor, message):
    with pytest.raises(ValueError, match=message):
        PixtralImageProcessor.from_dict({}, processor=processor)


def test_non_images_are_refused():
    with pytest.raises(TypeError, match="load_image"):
        PixtralImageProcessor.from_dict({})(np.zeros((4, 4, 3), dtype=np.uint8))
