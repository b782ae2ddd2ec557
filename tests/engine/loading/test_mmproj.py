"""Vision from GGUF: a tiny random vision-language model per family, converted by llama.cpp's own converter
(convert_hf_to_gguf.py, from the llama-cpp-python 0.3.36 sdist, with and without --mmproj), loaded by Tandem as
the GGUF pair and as the folder: the same image rows (float32, within 1e-5) and the same greedy tokens for an
image prompt. Also: the mmproj found beside the text file, and projectors Tandem cannot pair leave a text
model with the reason.

Families the converter cannot take are skipped by name with the reason (see docs/models.md, "Vision from GGUF"): LLaVA
(its --mmproj reads only Pixtral towers, CLIP and SigLIP are rejected; LLaVA with a CLIP tower is checked with
llama.cpp's legacy scripts in test_mmproj_llava.py).
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image, ImageDraw

from engine.cache import Cache
from engine.errors import MissingFileError, UnsupportedArchitectureError
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Model
from engine.models.gemma3 import Gemma3ForConditionalGeneration
from engine.models.vlm import VisionLanguageModel
from engine.vision.handle import vision_of


def _fast_tokenizer(path: Path, specials: list[str]) -> transformers.PreTrainedTokenizerFast:
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path), bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.add_special_tokens({"additional_special_tokens": specials})
    return tok


def _text_config(tok, tied: bool) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=tied,
    )


def build_idefics3(folder: Path, tokenizer_json: Path) -> None:
    """SmolVLM-256M's shape in small: a SigLIP tower on 24 px tiles, scale 3, a Llama text model whose
    text_config names VLlama3ForCausalLM (as SmolVLM's does: the converter reads the text model by it)."""
    specials = ["<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>"]
    tok = _fast_tokenizer(tokenizer_json, specials + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)])
    image_processor = transformers.Idefics3ImageProcessorPil(
        size={"longest_edge": 48}, max_image_size={"longest_edge": 24}
    )
    transformers.Idefics3Processor(image_processor=image_processor, tokenizer=tok, image_seq_len=4).save_pretrained(
        folder
    )
    vision = transformers.Idefics3VisionConfig(
        hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=3, image_size=24, patch_size=4
    )
    config = transformers.Idefics3Config(
        text_config={**_text_config(tok, tied=True).to_dict(), "architectures": ["VLlama3ForCausalLM"]},
        vision_config=vision.to_dict(),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        scale_factor=3,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    hf = transformers.Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # random init leaves the connector tiny; make the image rows matter to the logits
        hf.model.connector.modality_projection.proj.weight.normal_(0, 0.3)
    hf.save_pretrained(folder)


def build_pixtral(folder: Path, tokenizer_json: Path, mistral3: bool = False) -> None:
    """Pixtral-12B's layout in small: LlavaForConditionalGeneration with a Pixtral tower (last layer, every
    patch, gelu projector) and a Mistral text model. Three tower layers: the converter names the projector's
    tensors by block number and refuses linear_2 of a tower with fewer. Mistral 3 (Mistral Small 3.1's shape):
    the same tower (silu) with a 2 x 2 patch merger, tied embeddings, no projector bias."""
    tok = _fast_tokenizer(tokenizer_json, ["[IMG]", "[IMG_BREAK]", "[IMG_END]"])
    tok.save_pretrained(folder)
    text = transformers.MistralConfig(**{**_text_config(tok, tied=mistral3).to_dict(), "head_dim": 16})
    patch = 4 if mistral3 else 8
    vision = transformers.PixtralVisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=2,
        patch_size=patch,
        image_size=48,
        hidden_act="silu" if mistral3 else "gelu",
    )
    image_id = tok.convert_tokens_to_ids("[IMG]")
    if mistral3:
        config = transformers.Mistral3Config(
            text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_index=image_id, spatial_merge_size=2
        )
        hf = transformers.Mistral3ForConditionalGeneration
    else:
        config = transformers.LlavaConfig(
            text_config=text.to_dict(),
            vision_config=vision.to_dict(),
            image_token_index=image_id,
            vision_feature_layer=-1,
            vision_feature_select_strategy="full",
            projector_hidden_act="gelu",
        )
        hf = transformers.LlavaForConditionalGeneration
    torch.manual_seed(0)
    hf = hf(config).eval()
    with torch.no_grad():  # random init leaves the projector tiny; make the image rows matter to the logits
        for p in hf.model.multi_modal_projector.parameters():
            p.normal_(1.0 if p.dim() == 1 else 0.0, 0.3)
    hf.save_pretrained(folder)
    transformers.PixtralImageProcessorPil(size={"longest_edge": 48}, patch_size=patch).save_pretrained(folder)
    merge = ', "spatial_merge_size": 2' if mistral3 else ""
    (folder / "processor_config.json").write_text(
        f'{{"processor_class": "PixtralProcessor", "image_token": "[IMG]", "patch_size": {patch}{merge}}}'
    )


def build_qwen2_vl(folder: Path, tokenizer_json: Path, v2_5: bool = False) -> None:
    """Qwen2-VL in small: 4-pixel patches merged 2x2, M-RoPE sections [2, 3, 3] with a small theta so positions
    matter, transformers' default pixel limits (the mmproj has none). Three tower layers, as for Pixtral.
    Qwen2.5-VL: full attention in layer 1 only, 112-pixel windows (the mmproj keeps no window size; 112 is every
    released model's), so pictures over 112 pixels a side are cut into windows."""
    tok = _fast_tokenizer(tokenizer_json, ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    tok.save_pretrained(folder)
    transformers.Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2).save_pretrained(folder)
    text = {
        **_text_config(tok, tied=False).to_dict(),
        "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 100.0},
    }
    ids = {
        f"{name}_token_id": tok.convert_tokens_to_ids(token)
        for name, token in [("image", "<|image_pad|>"), ("video", "<|video_pad|>")]
        + [("vision_start", "<|vision_start|>"), ("vision_end", "<|vision_end|>")]
    }
    if v2_5:
        vision = dict(hidden_size=32, intermediate_size=48, out_hidden_size=64, window_size=112)
        vision |= dict(fullatt_block_indexes=[1])
        config_class, model_class = transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration
    else:
        vision = dict(embed_dim=32, hidden_size=64, mlp_ratio=2)
        config_class, model_class = transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration
    vision |= dict(depth=3, num_heads=2, patch_size=4, initializer_range=0.1)
    config = config_class(text_config=text, vision_config=vision, **ids)
    torch.manual_seed(7)
    hf = model_class(config).eval()
    with torch.no_grad():  # norms start at exactly 1: make them matter too
        for name, p in hf.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.normal_(1.0, 0.3)
    hf.save_pretrained(folder)


def build_gemma3(folder: Path, tokenizer_json: Path) -> None:
    """Gemma 3 in small: a SigLIP tower on 32 px pictures pooled to 16 image tokens, the text model with llama.cpp's
    fixed layer pattern (five sliding layers, then a full one: its converter writes no pattern) and
    query_pre_attn_scalar = head_dim (the file has none; llama.cpp uses head_dim below 27B). The converter stores
    the projection as F16 whatever --outtype says (llama.cpp #13025), so its values are made F16-exact here.
    transformers 5 saves the tower as vision_tower.embeddings...; released Gemma 3 checkpoints (and the converter's
    tensor map) say vision_tower.vision_model.embeddings...: the keys are rewritten into that layout before
    converting, as a downloaded checkpoint has them."""
    from safetensors.torch import load_file, save_file

    markers = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    _fast_tokenizer(tokenizer_json, list(markers.values())).save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "extra_special_tokens": markers}))
    tok = transformers.AutoTokenizer.from_pretrained(folder)  # with the markers Gemma3Processor reads
    image_processor = transformers.Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    transformers.Gemma3Processor(image_processor, tok, image_seq_length=16).save_pretrained(folder)
    text = transformers.Gemma3TextConfig(
        **{k: v for k, v in _text_config(tok, tied=True).to_dict().items() if k in _GEMMA3_SHARED},
        num_hidden_layers=6,
        head_dim=24,
        query_pre_attn_scalar=24,
        sliding_window=6,  # shorter than an image's 18 tokens
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
        },
    )
    vision = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=4,
        vision_use_head=False,
    )
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=16,
        **{f"{name.removesuffix('_token')}_token_index": tok.convert_tokens_to_ids(t) for name, t in markers.items()},
    )
    torch.manual_seed(3)
    hf = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms start at a scale of exactly 1 and the projection at zero: make both matter
        for name, p in hf.named_parameters():
            if "norm" in name and "vision_tower" not in name:
                p.normal_(0, 0.3)
        projection = hf.model.multi_modal_projector.mm_input_projection_weight
        projection.copy_(torch.randn_like(projection).mul(0.3).half().float())
    hf.save_pretrained(folder)
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    tower = "vision_tower."
    save_file(
        {tower + "vision_model." + k.removeprefix(tower) if k.startswith(tower) else k: v for k, v in tensors.items()},
        weights,
        metadata={"format": "pt"},
    )


# The shape keys Gemma 3's text config takes from the other families' tiny text config.
_GEMMA3_SHARED = (
    "vocab_size hidden_size intermediate_size num_attention_heads num_key_value_heads max_position_embeddings "
    "initializer_range bos_token_id eos_token_id pad_token_id tie_word_embeddings"
).split()


BUILDERS = {
    "gemma3": build_gemma3,
    "idefics3": build_idefics3,
    "pixtral": build_pixtral,
    "mistral3": lambda folder, tokenizer_json: build_pixtral(folder, tokenizer_json, mistral3=True),
    "qwen2_vl": build_qwen2_vl,
    "qwen2_5_vl": lambda folder, tokenizer_json: build_qwen2_vl(folder, tokenizer_json, v2_5=True),
}
SKIPPED = {
    "llava": "llama.cpp 0.3.36's convert_hf_to_gguf.py --mmproj reads LlavaForConditionalGeneration only with a "
    "Pixtral tower; CLIP and SigLIP towers are rejected ('Unsupported model type'). LLaVA with a CLIP tower is "
    "checked with llama.cpp's legacy scripts in test_mmproj_llava.py",
}


@pytest.fixture(scope="module", params=sorted(BUILDERS) + sorted(SKIPPED))
def pair(request, converter, known_tokenizer, tmp_path_factory):
    """(folder model, GGUF-pair model, folder): the converted text GGUF and mmproj-<family>.gguf sit in the
    folder, so the pair is also what Model.load finds by itself."""
    name = request.param
    if name in SKIPPED:
        pytest.skip(f"{name}: {SKIPPED[name]}")
    folder = tmp_path_factory.mktemp(name)
    BUILDERS[name](folder, known_tokenizer)
    converter(folder, folder / "text.gguf", mmproj=False)
    converter(folder, folder / f"mmproj-{name}.gguf", mmproj=True)
    from_folder = Model.load(folder, dtype=torch.float32)
    from_gguf = Model.load(folder / "text.gguf", dtype=torch.float32, mmproj=folder / f"mmproj-{name}.gguf")
    return from_folder, from_gguf, folder


def picture(size: tuple[int, int], seed: int) -> Image.Image:
    """Noise with a shape on it, so tiles differ and resizing has detail to work on."""
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    ImageDraw.Draw(img).ellipse((size[0] // 5, size[1] // 6, size[0] * 3 // 4, size[1] * 4 // 5), fill="red")
    return img


@pytest.mark.parametrize("size", [(61, 40), (20, 14), (250, 130)])
def test_image_rows_match_the_folder(pair, size):
    from_folder, from_gguf, _ = pair
    assert type(from_gguf) is type(from_folder) and from_gguf.vision_error is None
    img = picture(size, seed=1)
    ours = from_gguf.vision.get_image_embeddings(image=img)
    ref = from_folder.vision.get_image_embeddings(image=img)
    assert ours.num_tokens == ref.num_tokens == from_gguf.vision.count_image_tokens(img)
    torch.testing.assert_close(ours.embeddings, ref.embeddings, rtol=0, atol=1e-5)


def greedy_tokens(model, img) -> list[int]:
    """24 greedy tokens answering an image prompt about `img` (also test_mmproj_llava.py's)."""
    emb = model.vision.get_image_embeddings(image=img)
    image = getattr(emb, "prompt_text", emb.text_alias)  # Qwen2-VL wraps its run in vision start / end tokens
    text = f"<|im_start|>User:{image}What is in the picture?<|im_end|>\nAssistant:"
    ids = model.tokenizer.encode(text, encode_special_tokens=True, embeddings=[emb])
    job = DynamicJob(ids, 24, gen_settings=SamplerSettings.greedy(), identifier="a", embeddings=[emb])
    gen = DynamicGenerator(model, Cache(model, max_seq_len=512, page_size=8), model.tokenizer)
    gen.enqueue(job)
    out = []
    while gen.num_remaining_jobs():
        out += [t for r in gen.iterate() if "token_ids" in r for t in r["token_ids"][0].tolist()]
    return out


def test_greedy_tokens_of_an_image_prompt_match_the_folder(pair):
    from_folder, from_gguf, _ = pair
    img = picture((61, 40), seed=2)
    tokens = greedy_tokens(from_gguf, img)
    assert len(tokens) == 24 and tokens == greedy_tokens(from_folder, img)


def test_mmproj_beside_the_text_file_is_found(pair):
    from_folder, _, folder = pair
    found = Model.load(folder / "text.gguf", dtype=torch.float32)
    assert type(found) is type(from_folder) and vision_of(found) is not None


def test_the_model_card_sees_images_while_a_pairable_mmproj_lies_beside(pair, tmp_path):
    from engine.model_info import read_model_info

    _, _, folder = pair
    assert read_model_info(folder / "text.gguf").can_see_images
    alone = Path(shutil.copy(folder / "text.gguf", tmp_path / "text.gguf"))
    assert not read_model_info(alone).can_see_images
    mmproj = next(folder.glob("mmproj-*.gguf"))
    _copy_with(mmproj, tmp_path / "mmproj-other.gguf", **{"clip.projector_type": "cogvlm"})
    assert not read_model_info(alone).can_see_images  # a projector Tandem does not pair
    (tmp_path / "mmproj-other.gguf").unlink()
    shutil.copy(mmproj, tmp_path / mmproj.name)
    assert read_model_info(alone).can_see_images  # put beside it after the card first read the text file


@functools.cache
def _read_gguf(src: Path) -> tuple[str, list[tuple[str, object, object]], list[tuple[str, np.ndarray, list, object]]]:
    """(architecture, [(key, value, type)], [(tensor, data, raw shape, raw type)]) of a GGUF, by the installed
    gguf package: read once per file, since its reader takes about 5 s over a 49,152-token vocabulary and
    each family's text file is copied by two tests."""
    import gguf

    reader = gguf.GGUFReader(src)
    fields = [
        (name, field.contents(), field.types[0])
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.") and name != "general.architecture"
    ]
    tensors = [(t.name, np.array(t.data), list(reversed(t.shape.tolist())), t.tensor_type) for t in reader.tensors]
    return reader.fields["general.architecture"].contents(), fields, tensors


def _copy_with(src: Path, dst: Path, add_tensors: dict[str, np.ndarray] | None = None, **changes) -> Path:
    """`src` (a GGUF) written again with some metadata values changed (and float32 tensors added), by the
    installed gguf package."""
    import gguf

    arch, fields, tensors = _read_gguf(src)
    writer = gguf.GGUFWriter(dst, arch)
    for name, value, kind in fields:
        value = changes.get(name, value)
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, value)
        else:
            writer.add_key_value(name, value, kind)
    for name, data, shape, raw_dtype in tensors:
        writer.add_tensor(name, data, raw_shape=shape, raw_dtype=raw_dtype)
    for name, values in (add_tensors or {}).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.mark.parametrize(
    "changes, words",
    [
        (
            {"clip.projector_type": "cogvlm"},
            [
                "'cogvlm' projector",
                "Supported projector types: gemma3, idefics3, ",
                "pixtral, qwen2.5vl_merger, qwen2vl_merger",
            ],
        ),
        ({"clip.vision.projection_dim": 4096}, ["width 4096", "64 wide", "belongs to another model"]),
    ],
)
def test_an_mmproj_tandem_cannot_pair_leaves_a_text_model_with_the_reason(pair, tmp_path, changes, words):
    _, _, folder = pair
    mmproj = next(folder.glob("mmproj-*.gguf"))
    bad = _copy_with(mmproj, tmp_path / "mmproj-bad.gguf", **changes)
    model = Model.load(folder / "text.gguf", dtype=torch.float32, mmproj=bad)
    assert vision_of(model) is None and not isinstance(model, VisionLanguageModel)
    for w in words:
        assert w in model.vision_error
    assert model.tokenizer.decode(model.tokenizer.encode("Hello")[0]) == "Hello"  # still a working text model


def test_a_text_file_without_the_image_token_is_named(pair, tmp_path):
    _, _, folder = pair
    mmproj = next(folder.glob("mmproj-*.gguf"))
    shutil.copy(mmproj, tmp_path / mmproj.name)
    text = _copy_with(
        folder / "text.gguf",
        tmp_path / "text.gguf",
        **{
            "tokenizer.ggml.tokens": [
                t if t not in ("<image>", "[IMG]", "<|image_pad|>", "<image_soft_token>") else "<img>"
                for t in _tokens(folder / "text.gguf")
            ]
        },
    )
    model = Model.load(text, dtype=torch.float32)
    assert vision_of(model) is None and "no such token" in model.vision_error


def test_a_text_model_with_llama3_rope_factors_is_not_paired_yet(pair, tmp_path):
    from_folder, _, folder = pair
    if isinstance(from_folder, Gemma3ForConditionalGeneration):
        pytest.skip("llama.cpp's gemma3 has no llama3-style rope: its reader ignores rope_freqs.weight")
    mmproj = next(folder.glob("mmproj-*.gguf"))
    shutil.copy(mmproj, tmp_path / mmproj.name)
    head_dim = 16
    factors = {"rope_freqs.weight": np.ones(head_dim // 2, dtype=np.float32)}
    text = _copy_with(folder / "text.gguf", tmp_path / "text.gguf", add_tensors=factors)
    model = Model.load(text, dtype=torch.float32)
    assert vision_of(model) is None and "llama3-style rope" in model.vision_error


def _tokens(path: Path) -> list[str]:
    from engine.gguf.file import GGUFFile

    return list(GGUFFile.open(path).metadata["tokenizer.ggml.tokens"])


def test_of_several_projectors_beside_the_text_file_the_one_of_its_width_is_taken(pair, tmp_path):
    from_folder, _, folder = pair
    mmproj = next(folder.glob("mmproj-*.gguf"))
    text = Path(shutil.copy(folder / "text.gguf", tmp_path / "text.gguf"))
    _copy_with(mmproj, tmp_path / "mmproj-another-model.gguf", **{"clip.vision.projection_dim": 4096})
    shutil.copy(mmproj, tmp_path / "mmproj-z.gguf")
    model = Model.load(text, dtype=torch.float32)
    assert type(model) is type(from_folder) and model.vision_error is None
    shutil.copy(mmproj, tmp_path / "mmproj-y.gguf")  # two that fit: which is meant cannot be told
    model = Model.load(text, dtype=torch.float32)
    assert vision_of(model) is None and "several projector files" in model.vision_error
    assert "mmproj=" in model.vision_error


def test_a_named_mmproj_that_is_missing_or_not_a_projector_is_an_error(pair, tmp_path):
    _, _, folder = pair
    with pytest.raises(MissingFileError, match="does not exist"):
        Model.load(folder / "text.gguf", dtype=torch.float32, mmproj=tmp_path / "absent.gguf")
    with pytest.raises(Exception, match="not a projector file"):
        Model.load(folder / "text.gguf", dtype=torch.float32, mmproj=folder / "text.gguf")
    with pytest.raises(UnsupportedArchitectureError, match=r"is a vision projector \(mmproj\), not a model"):
        Model.load(next(folder.glob("mmproj-*.gguf")), dtype=torch.float32)
