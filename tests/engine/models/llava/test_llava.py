"""LLaVA (CLIP and SigLIP towers, Llama text model) against transformers: image features, logits of an
image+text prompt over the paged cache, greedy tokens; checkpoint layouts and config handling; counting an
image's ids without the vision tower (pictures of several sizes and shapes, counted by a model built with no
weights and no tower)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from PIL import Image, ImageDraw
from safetensors.torch import load_file, save_file

from engine.cache import Cache
from engine.config.model import ModelConfig
from engine.errors import ModelLoadError, UnsupportedArchitectureError
from engine.models import Batch, Model
from engine.models.llava import LlavaForConditionalGeneration
from engine.tokenizer.tokenizer import Tokenizer
from engine.vision.handle import vision_of

VOCAB = 211
IMAGE_ID = VOCAB - 1

TEXT = transformers.LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=80,
    intermediate_size=136,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

CASES = {
    # llava-1.5 shape: second-to-last CLIP layer without the class token.
    "clip": dict(
        vision_config=transformers.CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            image_size=28,
            patch_size=7,
        ),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    ),
    # Several SigLIP layers concatenated, every token kept, tied embeddings, projector without bias.
    "siglip": dict(
        vision_config=transformers.SiglipVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        vision_feature_layer=[-1, -3],
        vision_feature_select_strategy="full",
        multimodal_projector_bias=False,
        projector_hidden_act="gelu_pytorch_tanh",
        tie_word_embeddings=True,
    ),
}
TOKENS_PER_IMAGE = {"clip": 16, "siglip": 16}


def _build(name: str, folder):
    case = dict(CASES[name])
    tied = case.pop("tie_word_embeddings", False)
    text = transformers.LlamaConfig(**{**TEXT.to_dict(), "tie_word_embeddings": tied})
    config = transformers.LlavaConfig(text_config=text, image_token_index=IMAGE_ID, **case)
    torch.manual_seed(0)
    hf = transformers.LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # random init leaves the projector tiny; make the image rows matter to the logits
        for p in hf.model.multi_modal_projector.parameters():
            p.normal_(0, 0.3)
    hf.save_pretrained(folder)
    size = config.vision_config.image_size
    processor = {  # a real pair of each family: CLIP resizes the short side then crops, SigLIP squashes
        "clip": {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": size}, "crop_size": size},
        "siglip": {"image_processor_type": "SiglipImageProcessor", "size": {"height": size, "width": size}},
    }[name]
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return hf


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = _build(request.param, folder)
    return request.param, hf, Model.load(folder, dtype=torch.float32), folder


def _pixels(hf, n: int, seed: int = 1) -> torch.Tensor:
    size = hf.config.vision_config.image_size
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _prompt(tokens_per_image: int, before: int, after: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(3, IMAGE_ID, (before + after,), generator=g)
    image = torch.full((tokens_per_image,), IMAGE_ID)
    return torch.cat([torch.tensor([1]), text[:before], image, text[before:]])


def _inputs(model, ids: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
    """Text embeddings with the image rows spliced in where the image token stands."""
    x = model.embed(ids)
    x[ids == model.image_token_id] = model.encode_images(pixels[None])[0]
    return x


def test_structure(pair):
    name, hf, ours, _ = pair
    assert isinstance(ours, LlavaForConditionalGeneration)
    assert ours.tokens_per_image == TOKENS_PER_IMAGE[name]
    assert ours.image_token_id == IMAGE_ID
    assert vision_of(ours) is ours.vision is ours.vision_model
    assert ours.config.tie_word_embeddings == hf.config.tie_word_embeddings
    if ours.config.tie_word_embeddings:
        assert ours.language_model.lm_head.weight is ours.language_model.model.embed_tokens.weight


def test_image_features_match(pair):
    name, hf, ours, _ = pair
    pixels = _pixels(hf, 3)
    with torch.no_grad():
        ref = torch.stack(hf.get_image_features(pixel_values=pixels).pooler_output)
    got = ours.encode_images(pixels)
    assert got.shape == (3, ours.tokens_per_image, TEXT.hidden_size)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5, msg=name)


def test_image_prompt_logits_match(pair):
    name, hf, ours, _ = pair
    n = ours.tokens_per_image
    prompts = [_prompt(n, 3, 7, seed=2), _prompt(n, 11, 2, seed=3)]
    pixels = _pixels(hf, 2)
    cache = Cache(ours, max_seq_len=16 * 8, page_size=16)
    # Interleaved pages, so a wrong block table lookup cannot go unnoticed.
    tables = [[0, 2, 4], [1, 3, 5]]
    batch = Batch.build(cache, tables, [0, 0], [len(p) for p in prompts], logits="all")
    x = torch.cat([_inputs(ours, p, pixels[i]) for i, p in enumerate(prompts)])
    logits = ours(x, batch.positions(), batch)
    start = 0
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ref = hf(input_ids=p[None], pixel_values=pixels[i : i + 1]).logits[0]
            torch.testing.assert_close(logits[start : start + len(p)], ref, atol=1e-4, rtol=1e-4, msg=f"{name}: {i}")
            start += len(p)


def test_greedy_tokens_match(pair):
    name, hf, ours, _ = pair
    steps, page_size = 32, 8
    prompt = _prompt(ours.tokens_per_image, 4, 5, seed=4)
    pixels = _pixels(hf, 1, seed=5)
    cache = Cache(ours, max_seq_len=page_size * 10, page_size=page_size)
    table = [[7, 1, 5, 0, 9, 6, 2, 4]]  # 8 pages for 26 prompt + 32 new tokens, out of order
    inputs, past, generated = _inputs(ours, prompt, pixels[0]), 0, []
    for _ in range(steps):
        batch = Batch.build(cache, table, [past], [len(inputs)])
        next_id = ours(inputs, batch.positions(), batch).argmax(-1)
        past = batch.seq_lens_host[0]
        inputs = next_id  # one token id per step after the prefill
        generated.append(int(next_id))
    with torch.no_grad():
        ref = hf.generate(
            input_ids=prompt[None], pixel_values=pixels, max_new_tokens=steps, do_sample=False, eos_token_id=None
        )
    assert generated == ref[0, len(prompt) :].tolist(), name


def test_get_image_embeddings_matches_transformers_processor_and_features(pair, tmp_path):
    name, hf, ours, folder = pair
    img = Image.new("RGB", (45, 37), "navy")
    ImageDraw.Draw(img).ellipse((5, 3, 30, 33), fill="orange")
    img.save(tmp_path / "picture.png")
    hf_processor = {"clip": transformers.CLIPImageProcessorPil, "siglip": transformers.SiglipImageProcessorPil}[name]
    pixels = hf_processor.from_pretrained(folder)(images=[img], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        ref = hf.get_image_features(pixel_values=pixels).pooler_output[0]
    # exllamav2's call shape, with each kind of image source.
    for source in (img, tmp_path / "picture.png", (tmp_path / "picture.png").read_bytes()):
        emb = ours.vision_model.get_image_embeddings(model=ours, tokenizer=None, image=source, text_alias="<pic>")
        assert emb.text_alias == "<pic>" and emb.num_tokens == ours.tokens_per_image
        assert emb.embeddings.dtype == ours.dtype and emb.embeddings.device == ours.device
        torch.testing.assert_close(emb.embeddings, ref, atol=1e-5, rtol=1e-5, msg=f"{name}: {type(source).__name__}")
    other = Image.new("RGB", (45, 37), "navy")
    same_ids = ours.vision.get_image_embeddings(image=img.copy()).first_id
    assert same_ids == emb.first_id != ours.vision.get_image_embeddings(image=other).first_id
    with pytest.raises(ValueError, match="image="):
        ours.vision.get_image_embeddings(model=ours)


def test_image_placeholder_is_the_tokenizer_text(pair, tiny_llava_folder):
    _, _, ours, _ = pair
    assert ours.vision.image_placeholder is None  # this folder has no tokenizer files
    with_tokenizer = Model.load(tiny_llava_folder, dtype=torch.float32)
    assert with_tokenizer.vision.image_placeholder == "<image>"


def _rename_to_new_layout(name: str) -> str:
    # transformers 4.52-4.57 layout: everything under "model.", the CLIP/SigLIP tower under "vision_model.".
    for old, new in (
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("vision_tower.", "model.vision_tower.vision_model."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ):
        if name.startswith(old):
            return new + name[len(old) :]
    raise AssertionError(f"unexpected checkpoint name {name}")


def test_both_checkpoint_layouts_load_the_same(pair, tmp_path):
    name, hf, ours, folder = pair
    saved = load_file(folder / "model.safetensors")
    # transformers 5 writes the original ("language_model.model.*") layout back; the fixture loaded that one.
    assert any(k.startswith("language_model.model.") for k in saved)
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    save_file({_rename_to_new_layout(k): v for k, v in saved.items()}, tmp_path / "model.safetensors")
    renamed = Model.load(tmp_path, dtype=torch.float32)
    for (k, a), (_, b) in zip(ours.state_dict().items(), renamed.state_dict().items()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=f"{name}: {k}")


def _edited_config(folder, tmp_path, **changes) -> dict:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        section, _, field = key.rpartition(".")
        (config[section] if section else config)[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    return config


@pytest.mark.parametrize(
    "changes, error, message",
    [
        ({"vision_config.model_type": "intern_vit_6b"}, UnsupportedArchitectureError, "'intern_vit_6b'"),
        ({"text_config.model_type": "gemma9"}, UnsupportedArchitectureError, "'gemma9'"),
        ({"vision_feature_layer": -9}, ModelLoadError, "vision_feature_layer -9"),
        ({"vision_feature_layer": [-1, "last"]}, ModelLoadError, "vision_feature_layer"),
        ({"vision_feature_select_strategy": "cls"}, ModelLoadError, "'cls'"),
        ({"projector_hidden_act": "mish7"}, ModelLoadError, "projector_hidden_act is 'mish7'"),
        ({"image_token_index": "<image>"}, ModelLoadError, "image_token_index"),
    ],
)
def test_bad_configs_are_named(pair, tmp_path, changes, error, message):
    _, _, _, folder = pair
    _edited_config(folder, tmp_path, **changes)
    with pytest.raises(error, match=message):
        Model.load(tmp_path, dtype=torch.float32)


def test_missing_tower_tensor_is_named(pair, tmp_path):
    _, _, _, folder = pair
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    saved = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in saved.items() if "layers.0.mlp.fc2.weight" not in k}, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"encoder\.layers\.0\.mlp\.fc2\.weight.*vision encoder"):
        Model.load(tmp_path, dtype=torch.float32)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_sparse_text_config_takes_transformers_defaults(model_type):
    # llava-1.5's config.json text_config leaves out everything equal to the defaults of its model_type.
    text = {
        "model_type": model_type,
        "hidden_size": 64,
        "num_attention_heads": 32,
    }  # a multiple of every default kv count
    ours = ModelConfig.from_hf_dict({"architectures": ["LlavaForConditionalGeneration"], "text_config": text})
    ref = transformers.LlavaConfig(text_config=text).text_config
    assert ours.architecture == "LlavaForConditionalGeneration"
    eos = ref.eos_token_id
    assert ours.eos_token_ids == (() if eos is None else (eos,))
    window = getattr(ref, "sliding_window", None) if getattr(ref, "use_sliding_window", True) else None
    expected = dict(
        vocab_size=ref.vocab_size,
        hidden_size=ref.hidden_size,
        intermediate_size=ref.intermediate_size,
        num_hidden_layers=ref.num_hidden_layers,
        num_attention_heads=ref.num_attention_heads,
        num_key_value_heads=ref.num_key_value_heads,
        head_dim=getattr(ref, "head_dim", None) or ref.hidden_size // ref.num_attention_heads,
        rms_norm_eps=ref.rms_norm_eps,
        rope_theta=ref.rope_parameters["rope_theta"],
        max_position_embeddings=ref.max_position_embeddings,
        tie_word_embeddings=ref.tie_word_embeddings,
        attention_bias=getattr(ref, "attention_bias", model_type == "qwen2"),
        sliding_window=window,
        bos_token_id=ref.bos_token_id,
    )
    assert {k: getattr(ours, k) for k in expected} == expected


def test_empty_llava_config_is_llava_1_5():
    # transformers' LlavaConfig() is llava-1.5-7b: Llama-7B, CLIP ViT-L/14 at 336, layer -2, 576 image tokens.
    config = ModelConfig.from_hf_dict({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"})
    ref = transformers.LlavaConfig()
    with torch.device("meta"):
        model = LlavaForConditionalGeneration(config)
    assert model.tokens_per_image == ref.image_seq_length
    assert model.image_token_id == ref.image_token_index
    assert (config.hidden_size, config.num_hidden_layers) == (
        ref.text_config.hidden_size,
        ref.text_config.num_hidden_layers,
    )
    assert model.feature_layers == (ref.vision_config.num_hidden_layers + 1 + ref.vision_feature_layer,)
    # The last CLIP layer is never read, so it is not built.
    assert len(model.vision_tower.encoder.layers) == ref.vision_config.num_hidden_layers - 1


def test_text_only_models_have_no_vision(tiny_model):
    assert vision_of(tiny_model) is None


@pytest.mark.parametrize("size", [(28, 28), (40, 30), (7, 90), (300, 200)])
def test_image_token_count_needs_no_vision_tower(pair, tiny_llava_folder, size):
    # Every picture takes tokens_per_image ids; a model built without weights or vision tower says so.
    _, _, ours, folder = pair
    with torch.device("meta"):
        bare = LlavaForConditionalGeneration(ModelConfig.from_file(folder / "config.json"))
    bare.source_path, bare.vision_tower = folder, None
    image = Image.new("RGB", size, "red")
    real = ours.vision.get_image_embeddings(image=image)
    assert bare.vision.count_image_tokens(image) == real.num_tokens == TOKENS_PER_IMAGE[pair[0]]
    # A prompt encoded around the stand-in is as long as around the real embedding.
    tokenizer = Tokenizer.load(tiny_llava_folder)
    stand_in = bare.vision.stand_in(image)
    lengths = [len(tokenizer.encode(f"look: {e.text_alias} what?", embeddings=[e])[0]) for e in (stand_in, real)]
    assert lengths[0] == lengths[1]
