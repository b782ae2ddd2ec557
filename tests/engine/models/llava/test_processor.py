"""ImageProcessor against transformers' PIL image processors (CLIP, SigLIP), on images made here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil

from engine.errors import CorruptFileError, MissingFileError
from engine.models.llava.processor import ImageProcessor


def _gradient(width: int, height: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    red = x * 255 // max(width - 1, 1)
    green = y * 255 // max(height - 1, 1)
    blue = (x + y) * 255 // max(width + height - 2, 1)
    return np.stack([red, green, blue], axis=-1).astype(np.uint8)  # [H, W, 3]


def _images() -> dict[str, Image.Image]:
    rng = np.random.default_rng(1234)
    noise = lambda h, w, c=3: rng.integers(0, 256, (h, w, c), dtype=np.uint8)  # noqa: E731
    rgba = noise(50, 60, 4)
    rgba[:10, :, 3] = 0  # fully transparent band: must composite on white like the reference
    paletted_transparent = Image.fromarray(_gradient(31, 17)).convert("P", palette=Image.Palette.ADAPTIVE)
    paletted_transparent.info["transparency"] = 0
    return {
        "noise_333x517": Image.fromarray(noise(333, 517)),
        "gradient_224": Image.fromarray(_gradient(224, 224)),
        "very_wide_900x40": Image.fromarray(noise(40, 900)),
        "very_tall_30x700": Image.fromarray(_gradient(30, 700)),
        "tiny_7x5": Image.fromarray(noise(5, 7)),
        "one_pixel": Image.new("RGB", (1, 1), (200, 30, 90)),
        "rgba_noise": Image.fromarray(rgba, "RGBA"),
        "gray_gradient": Image.fromarray(_gradient(64, 48)[:, :, 0], "L"),
        "palette_noise": Image.fromarray(noise(80, 120)).convert("P", palette=Image.Palette.ADAPTIVE),
        "palette_transparent": paletted_transparent,
    }


IMAGES = _images()

CONFIGS = {
    # OpenAI CLIP as shipped: shortest edge 224, centre crop 224, bicubic.
    "clip": (CLIPImageProcessorPil, {"image_processor_type": "CLIPImageProcessor"}),
    # SigLIP at a fixed small square, bilinear, mean/std 0.5.
    "siglip_64_bilinear": (
        SiglipImageProcessorPil,
        {
            "image_processor_type": "SiglipImageProcessor",
            "size": {"height": 64, "width": 64},
            "resample": 2,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
        },
    ),
    "siglip_default_224": (SiglipImageProcessorPil, {"image_processor_type": "SiglipImageProcessorFast"}),
    # Unusual numbers: a crop taller than the resized image (zero padding), lanczos, odd mean/std/factor.
    "clip_unusual": (
        CLIPImageProcessorPil,
        {
            "image_processor_type": "CLIPImageProcessor",
            "size": {"shortest_edge": 50},
            "crop_size": {"height": 61, "width": 40},
            "resample": 1,
            "rescale_factor": 1 / 127.5,
            "image_mean": [0.1, 0.7, 0.3],
            "image_std": [0.9, 0.2, 0.5],
        },
    ),
    # Old-style ints: size 40 is a shortest edge (CLIP does not default to square), crop 32 a square;
    # no rescale, so normalisation works on 0..255 values.
    "clip_int_sizes_no_rescale": (
        CLIPImageProcessorPil,
        {
            "feature_extractor_type": "CLIPFeatureExtractor",
            "size": 40,
            "crop_size": 32,
            "do_rescale": False,
            "image_mean": 127.0,
            "image_std": 64.0,
        },
    ),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def config_pair(request, tmp_path_factory):
    reference_class, config = CONFIGS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    (folder / "preprocessor_config.json").write_text(json.dumps(config))
    return reference_class.from_pretrained(folder), ImageProcessor.from_folder(folder)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_pixels_match_transformers(config_pair, name):
    reference, processor = config_pair
    image = IMAGES[name]
    expected = reference(image, return_tensors="pt")["pixel_values"][0]
    got = processor(image)
    assert got.dtype == torch.float32
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_output_size_and_batch_shape():
    clip = ImageProcessor.from_dict({"image_processor_type": "CLIPImageProcessor"})
    assert clip.output_size == (224, 224)
    siglip = ImageProcessor.from_dict(
        {"image_processor_type": "SiglipImageProcessor", "size": {"height": 48, "width": 80}}
    )
    assert siglip.output_size == (48, 80)
    batch = siglip.batch([IMAGES["noise_333x517"], IMAGES["tiny_7x5"], IMAGES["rgba_noise"]])
    assert batch.shape == (3, 3, 48, 80) and batch.dtype == torch.float32
    torch.testing.assert_close(batch[1], siglip(IMAGES["tiny_7x5"]))


def test_shortest_edge_without_crop_follows_the_image():
    processor = ImageProcessor.from_dict(
        {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 20}, "do_center_crop": False}
    )
    assert processor.output_size is None
    # 517 wide x 333 high: height -> 20, width -> int(20 * 517 / 333) = 31
    assert processor(IMAGES["noise_333x517"]).shape == (3, 20, 31)
    assert processor(IMAGES["very_tall_30x700"]).shape == (3, int(20 * 700 / 30), 20)
    with pytest.raises(ValueError, match="different sizes"):
        processor.batch([IMAGES["noise_333x517"], IMAGES["very_tall_30x700"]])
    with pytest.raises(ValueError, match="at least one image"):
        processor.batch([])


def test_without_convert_rgb_alpha_is_dropped_not_composited():
    base = {"image_processor_type": "SiglipImageProcessor", "size": {"height": 16, "width": 16}}
    plain = ImageProcessor.from_dict({**base, "do_convert_rgb": False})
    rgba = IMAGES["rgba_noise"]
    torch.testing.assert_close(plain(rgba), plain(rgba.convert("RGB")))
    composited = ImageProcessor.from_dict(base)
    assert not torch.equal(plain(rgba), composited(rgba))


def test_rejects_non_image_input():
    processor = ImageProcessor.from_dict({"image_processor_type": "CLIPImageProcessor"})
    with pytest.raises(TypeError, match="load_image"):
        processor(np.zeros((4, 4, 3), dtype=np.uint8))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"image_processor_type": "Qwen2VLImageProcessor"}, "Qwen2VLImageProcessor"),
        ({"size": {"shortest_edge": 224}}, "image_processor_type"),
        ({"image_processor_type": ["CLIPImageProcessor"]}, "image_processor_type"),
        ({"image_processor_type": "CLIPImageProcessor", "do_pad": True}, "do_pad"),
        ({"image_processor_type": "SiglipImageProcessor", "do_image_splitting": True}, "do_image_splitting"),
        ({"image_processor_type": "CLIPImageProcessor", "size": {"longest_edge": 300}}, "size="),
        (
            {
                "image_processor_type": "CLIPImageProcessor",
                "size": {"shortest_edge": 224, "longest_edge": 300},
            },
            "size=",
        ),
        ({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 0}}, "size.shortest_edge"),
        ({"image_processor_type": "CLIPImageProcessor", "resample": 9}, "resample=9"),
        ({"image_processor_type": "CLIPImageProcessor", "image_mean": [0.5, 0.5]}, "image_mean"),
        ({"image_processor_type": "CLIPImageProcessor", "image_std": [0.5, 0.0, 0.5]}, "image_std"),
        ({"image_processor_type": "CLIPImageProcessor", "rescale_factor": -1}, "rescale_factor"),
        ({"image_processor_type": "CLIPImageProcessor", "do_resize": "yes"}, "do_resize"),
        ({"image_processor_type": "SiglipImageProcessor", "do_center_crop": True}, "crop_size"),
        ({"image_processor_type": "CLIPImageProcessor", "data_format": "channels_last"}, "data_format"),
        (
            {
                "image_processor_type": "CLIPImageProcessor",
                "auto_map": {"AutoImageProcessor": "x.MyProcessor"},
            },
            "auto_map",
        ),
    ],
)
def test_bad_configs_name_the_key(config, message):
    with pytest.raises(ValueError, match=message):
        ImageProcessor.from_dict(config)


def test_config_must_be_a_mapping():
    with pytest.raises(ValueError, match="JSON object"):
        ImageProcessor.from_dict(["CLIPImageProcessor"])  # type: ignore[arg-type]


def test_missing_and_corrupt_config_files(tmp_path):
    with pytest.raises(MissingFileError, match="preprocessor_config.json") as caught:
        ImageProcessor.from_folder(tmp_path)
    assert isinstance(caught.value, FileNotFoundError)
    with pytest.raises(MissingFileError, match="does not exist"):
        ImageProcessor.from_folder(tmp_path / "nowhere")
    (tmp_path / "preprocessor_config.json").write_text('{"image_processor_type": ')
    with pytest.raises(CorruptFileError, match="not valid JSON"):
        ImageProcessor.from_folder(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text("[1, 2]")
    with pytest.raises(CorruptFileError, match="JSON object"):
        ImageProcessor.from_folder(tmp_path)


def test_nested_processor_config_is_preferred(tmp_path):
    clip = {"image_processor_type": "CLIPImageProcessor"}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(clip))
    nested = {
        "image_processor": {
            "image_processor_type": "SiglipImageProcessor",
            "size": {"height": 32, "width": 32},
        }
    }
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    processor = ImageProcessor.from_folder(tmp_path)
    assert processor.kind == "siglip" and processor.output_size == (32, 32)
