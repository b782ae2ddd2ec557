"""Mistral 3 and Pixtral-12B (LLaVA with a Pixtral encoder) against transformers: pixel values and image
features of pictures of varied sizes, prompt ids and logits of chat prompts with one and two pictures, the
image rows, greedy tokens through DynamicGenerator, the same picture in two concurrent jobs, config / checkpoint
handling, and counting a picture's ids (breaks and end included) without the vision tower, against the reference
prompt's length (pictures shrunk, grown, a 100 x 9 sliver, a thin tall one)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from PIL import Image, ImageDraw
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from engine.cache import Cache
from engine.chat_template import ChatTemplate
from engine.config.model import ModelConfig
from engine.errors import ModelLoadError, TensorMismatchError, UnsupportedArchitectureError
from engine.generator.dynamic import DynamicGenerator
from engine.generator.images import splice_inputs
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Batch, Model
from engine.models.mistral3 import Mistral3ForConditionalGeneration, PixtralLlavaForConditionalGeneration
from engine.models.registry import model_class
from engine.tokenizer.tokenizer import Tokenizer
from engine.vision.handle import vision_of
from engine.vision.prompt import render_with_images

SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]
CORPUS = ["describe the picture please, what colour is the circle? a red circle on a blue sky.\n"] * 20
# Mistral's chat template, reduced to the user turns with images.
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST]"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}[IMG]"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}[/INST]"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
HIDDEN = 64
LONGEST_EDGE = 48

CASES = {
    # Mistral Small 3.1's shape: 2 x 2 patch merger, one encoder layer read, tied embeddings (Mistral3Config's
    # default), no projector bias.
    "mistral3": dict(
        vision=transformers.PixtralVisionConfig(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=2,
            patch_size=4,
            image_size=LONGEST_EDGE,
            hidden_act="silu",
        ),
        merge=2,
        processor={"patch_size": 4, "spatial_merge_size": 2},
    ),
    # Pixtral-12B's shape: LLaVA's projector over every patch, here over two encoder layers (the last one never
    # read, so not built); untied embeddings; the processor states only its patch.
    "pixtral_llava": dict(
        vision=transformers.PixtralVisionConfig(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=3,
            num_attention_heads=2,
            patch_size=8,
            image_size=LONGEST_EDGE,
        ),
        merge=1,
        processor={"patch_size": 8},
    ),
}


def _tokenizer(folder) -> transformers.PreTrainedTokenizerFast:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(folder / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=TEMPLATE,
    )
    fast.save_pretrained(folder)
    return fast


def _build(name: str, folder):
    case = CASES[name]
    fast = _tokenizer(folder)
    text = transformers.MistralConfig(
        vocab_size=len(fast),
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    image_id = fast.convert_tokens_to_ids("[IMG]")
    if name == "mistral3":
        config = transformers.Mistral3Config(
            text_config=text.to_dict(), vision_config=case["vision"].to_dict(), image_token_index=image_id
        )
        hf_class = transformers.Mistral3ForConditionalGeneration
    else:
        config = transformers.LlavaConfig(
            text_config=text.to_dict(),
            vision_config=case["vision"].to_dict(),
            image_token_index=image_id,
            vision_feature_layer=[-2, 0],
            vision_feature_select_strategy="full",
            projector_hidden_act="gelu",
        )
        hf_class = transformers.LlavaForConditionalGeneration
    torch.manual_seed(0)
    hf = hf_class(config).eval()
    with torch.no_grad():  # random init leaves the projector tiny; make the image rows matter to the logits
        for p in hf.model.multi_modal_projector.parameters():
            p.normal_(1.0 if p.dim() == 1 else 0.0, 0.3)
    hf.save_pretrained(folder)
    image_processor = transformers.PixtralImageProcessorPil(
        size={"longest_edge": LONGEST_EDGE}, patch_size=case["vision"].patch_size
    )
    image_processor.save_pretrained(folder)
    processor = {"processor_class": "PixtralProcessor", "image_token": "[IMG]", **case["processor"]}
    (folder / "processor_config.json").write_text(json.dumps(processor))
    return hf, fast, image_processor


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf, fast, image_processor = _build(request.param, folder)
    return request.param, hf, (fast, image_processor), Model.load(folder, dtype=torch.float32), folder


def picture(size: tuple[int, int], colour: str, seed: int) -> Image.Image:
    """Noise with a shape on it, so resizing has detail to work on and every patch differs."""
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    ImageDraw.Draw(img).ellipse((size[0] // 5, size[1] // 6, size[0] * 3 // 4, size[1] * 4 // 5), fill=colour)
    return img


BIG = picture((61, 40), "red", 1)  # shrunk to fit 48 px: 32 x 48 pixels, 4 x 6 tokens at 8 px per token
SMALL = picture((20, 14), "green", 2)  # grown to whole tokens: 16 x 24 pixels, 2 x 3 tokens


def _messages(*parts):
    return [
        {
            "role": "user",
            "content": [{"type": "image"} if p is None else {"type": "text", "text": p} for p in parts],
        }
    ]


def _token_patch(name: str) -> int:
    return CASES[name]["vision"].patch_size * CASES[name]["merge"]


def _ours(model, messages, images):
    """Our prompt ids [n] (image runs as alias ids) and embeddings for a chat with these pictures."""
    tok = model.tokenizer
    embeddings = [model.vision.get_image_embeddings(model=model, tokenizer=tok, image=img) for img in images]
    text = render_with_images(
        ChatTemplate.from_tokenizer(tok), messages, embeddings, placeholder=model.vision.image_placeholder
    )
    return tok.encode(text, encode_special_tokens=True, embeddings=embeddings)[0], embeddings


def _reference(name, tools, messages, images):
    """transformers' inputs for the chat, as PixtralProcessor makes them (it needs torchvision, which the test
    environment lacks, so its two steps are done here: the image processor with the processor's patch, then
    each [IMG] of the rendered chat replaced by [IMG] * cols + [IMG_BREAK] per row, the last break [IMG_END])."""
    fast, image_processor = tools
    patch = _token_patch(name)
    inputs = image_processor(images=list(images), patch_size=patch, return_tensors="pt")
    text = fast.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pieces = text.split("[IMG]")
    assert len(pieces) == len(images) + 1
    expanded = pieces[0]
    for (height, width), piece in zip(inputs["image_sizes"].tolist(), pieces[1:]):
        rows = ["[IMG]" * (width // patch) + "[IMG_BREAK]"] * (height // patch)
        expanded += "".join(rows).removesuffix("[IMG_BREAK]") + "[IMG_END]" + piece
    ids = fast(expanded, add_special_tokens=False, return_tensors="pt")["input_ids"]
    return {"input_ids": ids, "pixel_values": inputs["pixel_values"], "image_sizes": inputs["image_sizes"]}


def _expanded(model, ids, embeddings, images):
    """`ids` with each image's alias run replaced by the token ids of its layout."""
    out = ids.tolist()
    for emb, img in zip(embeddings, images):
        rows, cols = model.vision.processor.grid(model.vision.processor(img))
        start = out.index(emb.first_id)
        out[start : start + emb.num_tokens] = model.vision.prompt_ids(model.tokenizer, rows, cols).tolist()
    return out


def _logits(model, ids, embeddings):
    cache = Cache(model, max_seq_len=16 * 24, page_size=16)
    table = [list(range(23, -1, -1))[: (len(ids) + 15) // 16]]  # pages out of order
    batch = Batch.build(cache, table, [0], [len(ids)], logits="all")
    x = splice_inputs(model, ids, [(0, len(ids), embeddings)])
    return model(x, batch.positions(), batch)


def _hf_features(hf, ref) -> torch.Tensor:
    with torch.no_grad():
        out = hf.model.get_image_features(pixel_values=ref["pixel_values"], image_sizes=ref["image_sizes"])
    return torch.cat(list(out.pooler_output))


def test_structure(pair):
    name, hf, _, ours, _ = pair
    expected = Mistral3ForConditionalGeneration if name == "mistral3" else PixtralLlavaForConditionalGeneration
    assert type(ours) is expected
    assert ours.config.architecture == hf.config.architectures[0]
    assert vision_of(ours) is ours.vision is ours.vision_model
    assert ours.image_token_id == hf.config.image_token_index
    assert ours.token_patch == _token_patch(name)
    assert ours.vision.image_placeholder == "[IMG]"
    tied = hf.lm_head.weight is hf.model.language_model.embed_tokens.weight
    assert tied == (name == "mistral3")
    assert (ours.language_model.lm_head.weight is ours.language_model.model.embed_tokens.weight) == tied
    if name == "pixtral_llava":
        assert len(ours.vision_tower.transformer.layers) == 2  # layer 3 is never read


def test_pixels_and_image_features_match(pair):
    name, hf, tools, ours, _ = pair
    for img in (BIG, SMALL):
        ref = _reference(name, tools, _messages(None), [img])
        pixels = ours.vision.processor(img)
        assert tuple(pixels.shape[1:]) == tuple(ref["image_sizes"][0].tolist())
        torch.testing.assert_close(pixels, ref["pixel_values"][0], atol=1e-5, rtol=0)
        (got,) = ours.encode_images([pixels])
        rows, cols = ours.vision.processor.grid(pixels)
        assert got.shape == (rows * cols, HIDDEN)
        torch.testing.assert_close(got, _hf_features(hf, ref), atol=1e-5, rtol=1e-5, msg=name)
    # Two pictures of different sizes in one call (one encoder sequence, block-diagonal attention).
    ref = _reference(name, tools, _messages(None, None), [BIG, SMALL])
    got = torch.cat(ours.encode_images([ours.vision.processor(BIG), ours.vision.processor(SMALL)]))
    torch.testing.assert_close(got, _hf_features(hf, ref), atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("images", [(BIG,), (BIG, SMALL)], ids=["one-image", "two-images"])
def test_chat_prompt_ids_and_logits_match(pair, images):
    name, hf, tools, ours, _ = pair
    messages = _messages(*([None] * len(images)), "what colour is the circle?")
    ids, embeddings = _ours(ours, messages, images)
    ref = _reference(name, tools, messages, images)
    assert _expanded(ours, ids, embeddings, images) == ref["input_ids"][0].tolist()
    with torch.no_grad():
        expected = hf(**ref).logits[0]
    torch.testing.assert_close(_logits(ours, ids, embeddings), expected, atol=1e-4, rtol=1e-4, msg=name)


def test_image_rows_are_the_transformers_input_embeddings(pair, tmp_path):
    name, hf, tools, ours, _ = pair
    BIG.save(tmp_path / "big.png")
    ref = _reference(name, tools, _messages(None, "hi"), [BIG])
    ids = ref["input_ids"][0]
    with torch.no_grad():
        embeds = hf.get_input_embeddings()(ids)
    embeds[ids == hf.config.image_token_index] = _hf_features(hf, ref)
    start = ids.tolist().index(hf.config.image_token_index)
    # exllamav2's call shape, with each kind of image source.
    for source in (BIG, tmp_path / "big.png", (tmp_path / "big.png").read_bytes()):
        emb = ours.vision_model.get_image_embeddings(
            model=ours, tokenizer=ours.tokenizer, image=source, text_alias="<p>"
        )
        assert emb.text_alias == "<p>" and emb.embeddings.dtype == ours.dtype
        assert emb.num_tokens == 4 * 7  # 4 rows of 6 image tokens and a break (the last one the end)
        torch.testing.assert_close(emb.embeddings, embeds[start : start + emb.num_tokens], atol=1e-5, rtol=1e-5)
    assert ours.vision.get_image_embeddings(image=BIG.copy()).first_id == emb.first_id
    assert ours.vision.get_image_embeddings(image=SMALL).first_id != emb.first_id
    with pytest.raises(ValueError, match="image="):
        ours.vision.get_image_embeddings(model=ours)


def make_gen(model, pages=64, page_size=8):
    return DynamicGenerator(model, Cache(model, max_seq_len=pages * page_size, page_size=page_size), model.tokenizer)


def run(gen, jobs):
    gen.enqueue(jobs)
    out: dict[object, list[dict]] = {j.identifier: [] for j in jobs}
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            out[r["identifier"]].append(r)
    return out


def tokens(results) -> list[int]:
    return [t for r in results if "token_ids" in r for t in r["token_ids"][0].tolist()]


@pytest.mark.parametrize("images", [(BIG,), (SMALL, BIG)], ids=["one-image", "two-images"])
def test_image_job_matches_transformers_greedy(pair, images):
    name, hf, tools, ours, _ = pair
    messages = _messages(*([None] * len(images)), "describe the picture")
    ids, embeddings = _ours(ours, messages, images)
    job = DynamicJob(ids[None], 32, gen_settings=SamplerSettings.greedy(), identifier="a", embeddings=embeddings)
    got = tokens(run(make_gen(ours), [job])["a"])
    ref = _reference(name, tools, messages, images)
    with torch.no_grad():
        out = hf.generate(**ref, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert got == out[0, ref["input_ids"].shape[1] :].tolist(), name


def test_same_image_in_two_concurrent_jobs_is_computed_once(pair):
    _, _, _, ours, _ = pair

    def job(question, ident):
        ids, embeddings = _ours(ours, _messages(None, question), [BIG])
        return DynamicJob(ids[None], 4, gen_settings=SamplerSettings.greedy(), identifier=ident, embeddings=embeddings)

    first, second = job("what is it?", "first"), job("which colour?", "second")
    emb = first.embeddings[0]
    prefix = first.prompt_ids.index(emb.first_id) + emb.num_tokens
    both = run(make_gen(ours), [first, second])
    assert both["first"][-1]["cached_tokens"] == 0
    assert both["second"][-1]["cached_tokens"] >= prefix  # the whole image run came from the first job's pages
    alone = run(make_gen(ours), [job("which colour?", "alone")])["alone"]
    assert tokens(both["second"]) == tokens(alone)
    alone_first = run(make_gen(ours), [job("what is it?", "alone")])["alone"]
    assert tokens(both["first"]) == tokens(alone_first)


# --- configs and checkpoints --------------------------------------------------------------------------------


def _edited_folder(folder, tmp_path, file="config.json", **changes):
    for item in folder.iterdir():
        if item.name != file:
            (tmp_path / item.name).symlink_to(item)
    config = json.loads((folder / file).read_text())
    for key, value in changes.items():
        section, _, field = key.rpartition(".")
        (config[section] if section else config)[field] = value
    (tmp_path / file).write_text(json.dumps(config))
    return tmp_path


BAD_CONFIGS = {
    "mistral3": [
        ({"vision_config.hidden_act": "mish7"}, ModelLoadError, "'mish7'"),
        ({"text_config.model_type": "gemma9"}, UnsupportedArchitectureError, "'gemma9'"),
        ({"spatial_merge_size": 0}, ModelLoadError, "spatial_merge_size"),
        ({"vision_feature_layer": [-1, -2]}, ModelLoadError, "exactly one"),
        ({"vision_feature_layer": 5}, ModelLoadError, "vision_feature_layer 5"),
        (
            {"vision_config.rope_parameters": {"rope_type": "linear", "rope_theta": 1.0}},
            ModelLoadError,
            "'linear'",
        ),
        ({"image_token_index": "[IMG]"}, ModelLoadError, "image_token"),
        # Another merge factor needs a merger of another width than the checkpoint's.
        ({"spatial_merge_size": 1}, TensorMismatchError, "merging_layer"),
    ],
    "pixtral_llava": [
        ({"vision_feature_select_strategy": "default"}, ModelLoadError, "'default'"),
        ({"vision_config.num_attention_heads": 3}, ModelLoadError, "3 heads"),
        ({"projector_hidden_act": "mish7"}, ModelLoadError, "'mish7'"),
        (
            {"vision_feature_layer": [-1]},
            TensorMismatchError,
            "linear_1",
        ),  # one layer fewer than the projector's
    ],
}


def test_bad_configs_are_named(pair, tmp_path):
    name, _, _, _, folder = pair
    for n, (changes, error, message) in enumerate(BAD_CONFIGS[name]):
        (tmp_path / str(n)).mkdir()
        with pytest.raises(error, match=message):
            Model.load(_edited_folder(folder, tmp_path / str(n), **changes), dtype=torch.float32)


def test_missing_tensors_are_named(pair, tmp_path):
    name, _, _, _, folder = pair
    saved = load_file(folder / "model.safetensors")
    projector = "multi_modal_projector.linear_2.weight"
    for missing, message in ((projector, "linear_2.weight"), ("vision_tower.ln_pre.weight", "ln_pre.weight")):
        target = tmp_path / missing
        target.mkdir()
        (target / "config.json").write_text((folder / "config.json").read_text())
        save_file({k: v for k, v in saved.items() if k != missing}, target / "model.safetensors")
        with pytest.raises(TensorMismatchError, match=message):
            Model.load(target, dtype=torch.float32)


def _rename_to_nested_layout(name: str) -> str:
    # transformers 4.52-4.57 layout: everything under "model.", the head at "lm_head.".
    for old, new in (
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("vision_tower.", "model.vision_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ):
        if name.startswith(old):
            return new + name[len(old) :]
    raise AssertionError(f"unexpected checkpoint name {name}")


def test_both_checkpoint_layouts_load_the_same(pair, tmp_path):
    name, _, _, ours, folder = pair
    saved = load_file(folder / "model.safetensors")
    assert any(k.startswith("language_model.model.") for k in saved)
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    save_file({_rename_to_nested_layout(k): v for k, v in saved.items()}, tmp_path / "model.safetensors")
    renamed = Model.load(tmp_path, dtype=torch.float32)
    for (k, a), (_, b) in zip(ours.state_dict().items(), renamed.state_dict().items()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=f"{name}: {k}")


@pytest.mark.parametrize("pair", ["mistral3"], indirect=True)  # only Mistral 3's config ties by default
def test_own_head_wins_over_a_tied_config(pair, tmp_path):
    # transformers 5 writes Mistral3Config's "tie_word_embeddings": true into config.json even for a
    # checkpoint with its own head; it then keeps that head, and so must we.
    _, _, _, _, folder = pair
    saved = load_file(folder / "model.safetensors")
    assert "language_model.lm_head.weight" not in saved
    head = torch.randn(
        saved["language_model.model.embed_tokens.weight"].shape, generator=torch.Generator().manual_seed(3)
    )
    for item in folder.iterdir():
        if item.name != "model.safetensors":
            (tmp_path / item.name).symlink_to(item)
    save_file({**saved, "language_model.lm_head.weight": head}, tmp_path / "model.safetensors")
    hf = transformers.Mistral3ForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32)
    ours = Model.load(tmp_path, dtype=torch.float32)
    torch.testing.assert_close(hf.lm_head.weight, head, atol=0, rtol=0)
    torch.testing.assert_close(ours.language_model.lm_head.weight, head, atol=0, rtol=0)
    assert ours.language_model.model.embed_tokens.weight is not ours.language_model.lm_head.weight


def test_processor_that_disagrees_with_the_model_is_named(pair, tmp_path):
    name, _, _, _, folder = pair
    edited = _edited_folder(
        folder, tmp_path, file="processor_config.json", patch_size=CASES[name]["vision"].patch_size + 1
    )
    model = Model.load(edited, dtype=torch.float32)
    with pytest.raises(ValueError, match="patch_size x spatial_merge_size"):
        model.vision.get_image_embeddings(image=SMALL)


def test_tokenizer_without_the_layout_tokens_is_refused(pair):
    _, _, _, ours, _ = pair
    plain = HFTokenizer(models.BPE())
    plain.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    plain.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=280, show_progress=False))
    with pytest.raises(ValueError, match=r"\[IMG_BREAK\]"):
        ours.vision.get_image_embeddings(tokenizer=Tokenizer(plain), image=SMALL)


def test_config_without_sub_configs_takes_mistral3_defaults():
    # null sub-configs mean "Mistral 3's own", as in transformers (not the Mistral / Pixtral class defaults).
    d = {"architectures": ["Mistral3ForConditionalGeneration"], "text_config": None, "vision_config": None}
    config = ModelConfig.from_hf_dict(d)
    ref = transformers.Mistral3Config(text_config=None, vision_config=None)
    with torch.device("meta"):
        model = Mistral3ForConditionalGeneration(config)
    text = model.config
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
    ):
        assert getattr(text, field) == getattr(ref.text_config, field), field
    assert (text.num_key_value_heads, text.head_dim) == (
        ref.text_config.num_key_value_heads,
        ref.text_config.head_dim,
    )
    assert text.rope_theta == ref.text_config.rope_parameters["rope_theta"]
    assert text.rms_norm_eps == ref.text_config.rms_norm_eps
    assert text.sliding_window == ref.text_config.sliding_window
    assert text.architecture == "Mistral3ForConditionalGeneration" and text.text_architecture == "MistralForCausalLM"
    vision = model.vision_tower.config
    for field in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "patch_size",
        "image_size",
        "hidden_act",
    ):
        assert getattr(vision, field) == getattr(ref.vision_config, field), field
    assert model.image_token_id == ref.image_token_index
    assert model.merge_size == ref.spatial_merge_size
    assert model.feature_layers == (ref.vision_config.num_hidden_layers,)
    assert model.multi_modal_projector.linear_1.bias is None


def test_registry_knows_mistral3():
    assert model_class("Mistral3ForConditionalGeneration") is Mistral3ForConditionalGeneration


# --- counting an image's tokens for the context meter --------------------------------------------------------


@pytest.mark.parametrize("size", [(61, 40), (20, 14), (7, 90), (100, 9), (48, 48)])
def test_image_token_count_needs_no_vision_tower(pair, size):
    # A model built without weights and without its vision tower counts what the real one embeds: rows x
    # (cols + 1) of the picture's resized token grid, breaks and end token included.
    name, _, tools, ours, folder = pair
    with torch.device("meta"):
        bare = type(ours)(ModelConfig.from_file(folder / "config.json"))
    bare.source_path, bare.vision_tower = folder, None
    image = picture(size, "red", 3)
    assert bare.vision.count_image_tokens(image) == ours.vision.get_image_embeddings(image=image).num_tokens
    # A chat rendered around the stand-in is as long as the reference's prompt.
    messages, tok = _messages(None, "what colour is the circle?"), ours.tokenizer
    stand_in = bare.vision.stand_in(image)
    text = render_with_images(
        ChatTemplate.from_tokenizer(tok), messages, [stand_in], placeholder=ours.vision.image_placeholder
    )
    ids = tok.encode(text, encode_special_tokens=True, embeddings=[stand_in])[0]
    assert len(ids) == _reference(name, tools, messages, [image])["input_ids"].shape[-1]
