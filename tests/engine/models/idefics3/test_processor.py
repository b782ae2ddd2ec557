"""Idefics3 / SmolVLM tiling against transformers' Idefics3ImageProcessorPil and SmolVLMImageProcessorPil (pixel
values, rows and columns), the resize arithmetic, and the image prompt text and its token ids against the
processors'."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from PIL import Image, ImageDraw
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers.models.idefics3 import image_processing_pil_idefics3 as hf_idefics3
from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

from engine.errors import CorruptFileError, MissingFileError
from engine.models.idefics3.processor import Idefics3ImageProcessor, image_prompt, longest_edge_hw
from engine.tokenizer.tokenizer import Tokenizer

REFERENCES = {"idefics3": transformers.Idefics3ImageProcessorPil, "smolvlm": transformers.SmolVLMImageProcessorPil}

CONFIGS = {
    "split": dict(size={"longest_edge": 48}, max_image_size={"longest_edge": 16}),
    "no-splitting": dict(size={"longest_edge": 48}, max_image_size={"longest_edge": 16}, do_image_splitting=False),
    "one-tile": dict(size={"longest_edge": 16}, max_image_size={"longest_edge": 16}),
    "no-resize": dict(do_resize=False, max_image_size={"longest_edge": 24}),
    "exact-size": dict(size={"height": 30, "width": 50}, max_image_size={"longest_edge": 16}),
    # A longest edge that is not a whole number of tiles, bicubic, no normalisation.
    "bicubic-raw": dict(size={"longest_edge": 45}, max_image_size={"longest_edge": 20}, resample=3, do_normalize=False),
    "no-rescale": dict(
        size={"longest_edge": 32},
        max_image_size={"longest_edge": 16},
        do_rescale=False,
        image_mean=[120.0, 127.5, 100.0],
        image_std=[60.0, 70.0, 50.0],
    ),
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
    "wide": _noise((61, 17), 1),
    "tall": _noise((13, 50), 2),
    "landscape": _noise((40, 28), 3),
    "odd-sides": _noise((45, 29), 4),
    "tiny": _noise((5, 3), 5),
    "one-pixel": _noise((1, 1), 6),
    "one-tile": _noise((16, 16), 8),
    "rgba": _transparent(),
    "grey": _noise((30, 37), 9, mode="L"),
    "palette": _noise((27, 19), 10, mode="P"),
}


def _reference(family: str, config: dict, img: Image.Image):
    out = REFERENCES[family](**config)(images=[[img]], return_tensors="pt", return_row_col_info=True)
    return out["pixel_values"][0], out["rows"][0][0], out["cols"][0][0]


@pytest.mark.parametrize("family", sorted(REFERENCES))
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_tiles_match_transformers(family, config_name):
    config = CONFIGS[config_name]
    ours = Idefics3ImageProcessor.from_dict(REFERENCES[family](**config).to_dict())
    for name, img in IMAGES.items():
        pixels, rows, cols = _reference(family, config, img)
        got = ours(img)
        assert (got.rows, got.cols) == (rows, cols), name
        assert got.pixel_values.dtype == torch.float32
        torch.testing.assert_close(got.pixel_values, pixels, atol=1e-5, rtol=0, msg=f"{config_name}: {name}")


def test_default_config_matches_transformers():
    # The class defaults (1456 px longest edge, 364 px tiles): a small 40x28 picture becomes 3 x 4 tiles + global.
    ours = Idefics3ImageProcessor.from_dict({"image_processor_type": "SmolVLMImageProcessor"})
    pixels, rows, cols = _reference("smolvlm", {}, IMAGES["landscape"])
    got = ours(IMAGES["landscape"])
    assert (got.rows, got.cols) == (rows, cols) == (3, 4)
    torch.testing.assert_close(got.pixel_values, pixels, atol=1e-5, rtol=0)


def test_splitting_happens_only_beyond_one_tile():
    ours = Idefics3ImageProcessor.from_dict(CONFIGS["no-resize"])
    small, large = ours(IMAGES["landscape"]), ours(IMAGES["wide"])  # 40x28 -> 48x48; 61x17 -> 72x24
    assert (small.rows, small.cols, small.num_tiles) == (2, 2, 5)
    assert (large.rows, large.cols, large.num_tiles) == (1, 3, 4)
    one = ours(IMAGES["one-tile"])
    assert (one.rows, one.cols, one.num_tiles) == (0, 0, 1)


@pytest.mark.parametrize("longest_edge", [16, 45, 364, 1456, 2048, 5000, 9000])
def test_first_resize_matches_transformers(longest_edge):
    # Includes results over the 4096 px cap and sides that round up to even.
    sides = [1, 2, 3, 7, 16, 29, 45, 100, 333, 1000, 4097, 8191]
    for height in sides:
        for width in sides:
            shape_only = np.broadcast_to(np.uint8(0), (3, height, width))
            expected = hf_idefics3.get_resize_output_image_size(shape_only, resolution_max_side=longest_edge)
            assert longest_edge_hw(height, width, longest_edge) == tuple(expected), (height, width)


@pytest.mark.parametrize("rows, cols", [(0, 0), (1, 1), (1, 3), (3, 1), (2, 2), (4, 3)])
@pytest.mark.parametrize("tokens_per_tile", [1, 4, 64])
def test_image_prompt_is_the_processors_text(rows, cols, tokens_per_tile):
    expected = get_image_prompt_string(
        rows,
        cols,
        tokens_per_tile,
        fake_token_around_image="<fake_token_around_image>",
        image_token="<image>",
        global_image_token="<global-img>",
    )
    assert image_prompt(rows, cols, tokens_per_tile) == expected
    custom = dict(image_token="<im>", fake_token="<f>", global_token="<g>")
    assert image_prompt(rows, cols, tokens_per_tile, **custom) == get_image_prompt_string(
        rows, cols, tokens_per_tile, fake_token_around_image="<f>", image_token="<im>", global_image_token="<g>"
    )


SPECIAL = [
    "<|endoftext|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
]


@pytest.fixture(scope="module")
def processor_folder(tmp_path_factory):
    """A transformers Idefics3Processor (tiny BPE tokenizer that merges "\\n\\n") saved to a folder."""
    folder = tmp_path_factory.mktemp("idefics3-processor")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=360,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL,
        show_progress=False,
    )
    tok.train_from_iterator(["User: look at these\n\nAssistant: two pictures.\n\n"] * 20, trainer)
    tok.save(str(folder / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), pad_token="<|endoftext|>"
    )
    processor = transformers.Idefics3Processor(
        image_processor=transformers.Idefics3ImageProcessorPil(**CONFIGS["split"]), tokenizer=fast, image_seq_len=3
    )
    processor.save_pretrained(folder)
    return folder, processor


def test_prompt_ids_match_the_processor(processor_folder):
    folder, processor = processor_folder
    ours, tokenizer = Idefics3ImageProcessor.from_folder(folder), Tokenizer.load(folder)
    assert tokenizer.encode("\n\n")[0].tolist() != tokenizer.encode("\n")[0].tolist() * 2  # a merge to get right
    images = [IMAGES["wide"], IMAGES["tiny"], IMAGES["tall"]]
    text = "User:<image>look at these<image> and\n<image><end_of_utterance>\nAssistant:"
    expected = processor(text=[text], images=[images])["input_ids"][0]
    pieces = text.split("<image>")
    expanded = pieces[0]
    for img, piece in zip(images, pieces[1:]):
        split = ours(img)
        expanded += image_prompt(split.rows, split.cols, ours.image_seq_len) + piece
    assert tokenizer.encode(expanded, encode_special_tokens=True)[0].tolist() == list(expected)


def test_folder_layouts_read_the_same(processor_folder, tmp_path):
    folder, processor = processor_folder
    combined = Idefics3ImageProcessor.from_folder(folder)  # transformers 5: processor_config.json holds it all
    assert combined.image_seq_len == 3 and combined.tile_size == 16 and combined.longest_edge == 48
    processor.image_processor.save_pretrained(tmp_path)  # the older preprocessor_config.json on its own
    separate = Idefics3ImageProcessor.from_folder(tmp_path)
    assert separate.image_seq_len is None
    assert {**vars(separate), "image_seq_len": 3} == vars(combined)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"image_processor_type": "CLIPImageProcessor"}, "'CLIPImageProcessor'"),
        ({"size": {"shortest_edge": 5}}, "size="),
        ({"size": {"longest_edge": 0}}, "size.longest_edge"),
        ({"max_image_size": {"height": 3}}, "max_image_size"),
        ({"max_image_size": {"longest_edge": "364"}}, "max_image_size.longest_edge"),
        ({"resample": 9}, "resample=9"),
        ({"image_std": [0.5, 0, 0.5]}, "image_std"),
        ({"image_mean": [0.5, 0.5]}, "image_mean"),
        ({"do_resize": "yes"}, "do_resize"),
        ({"rescale_factor": -1}, "rescale_factor"),
        ({"data_format": "channels_last"}, "channels_last"),
    ],
)
def test_bad_configs_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        Idefics3ImageProcessor.from_dict({"image_processor_type": "Idefics3ImageProcessor", **changes}, source="cfg")


def test_bad_inputs_and_folders_are_named(tmp_path):
    with pytest.raises(ValueError, match="JSON object"):
        Idefics3ImageProcessor.from_dict(["size"])
    with pytest.raises(TypeError, match="load_image"):
        Idefics3ImageProcessor.from_dict({})(np.zeros((8, 8, 3), dtype=np.uint8))
    with pytest.raises(MissingFileError, match="does not exist"):
        Idefics3ImageProcessor.from_folder(tmp_path / "nowhere")
    with pytest.raises(MissingFileError, match="preprocessor_config.json"):
        Idefics3ImageProcessor.from_folder(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(CorruptFileError, match="not valid JSON"):
        Idefics3ImageProcessor.from_folder(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "SmolVLMImageProcessor"}))
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_len": -4}))
    with pytest.raises(ValueError, match="image_seq_len"):
        Idefics3ImageProcessor.from_folder(tmp_path)
