"""Idefics3 and SmolVLM against transformers: tiles and image features, prompt ids and logits of chat prompts
with split images, greedy tokens through DynamicGenerator, two images in one message, the same image in two
concurrent jobs, config / checkpoint errors, and counting a picture's ids (tiles, global image, markers) without the
vision tower, against transformers' processor's prompt length (pictures cut and uncut, thin, large)."""

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
from engine.models.idefics3 import Idefics3ForConditionalGeneration
from engine.models.registry import model_class
from engine.tokenizer.tokenizer import Tokenizer
from engine.vision.handle import vision_of
from engine.vision.prompt import render_with_images

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
]
CORPUS = ["User: describe the picture please, what colour is it?\n\nAssistant: a red circle on a blue sky.\n\n"] * 20
# SmolVLM's chat template (image branch), as its tokenizer_config.json ships it.
TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
TOKENS_PER_TILE = 4
HIDDEN = 64

CASES = {
    # Tiles (16 px) smaller than the encoder's 32 px grid: learned positions are bucketed. Every picture is
    # resized to a 48 px longest edge, so it is always cut (up to 3 x 3 tiles).
    "idefics3": dict(
        hf_class=transformers.Idefics3ForConditionalGeneration,
        config_class=transformers.Idefics3Config,
        vision=transformers.Idefics3VisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=4,
        ),
        scale_factor=2,
        tied=False,
        image_processor=transformers.Idefics3ImageProcessorPil(
            size={"longest_edge": 48}, max_image_size={"longest_edge": 16}
        ),
    ),
    # Tiles equal to the encoder's grid, scale 3, tied embeddings; no first resize, so a small picture stays
    # one tile and a large one is cut.
    "smolvlm": dict(
        hf_class=transformers.SmolVLMForConditionalGeneration,
        config_class=transformers.SmolVLMConfig,
        vision=transformers.SmolVLMVisionConfig(
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=3,
            image_size=24,
            patch_size=4,
        ),
        scale_factor=3,
        tied=True,
        image_processor=transformers.SmolVLMImageProcessorPil(do_resize=False, max_image_size={"longest_edge": 24}),
    ),
}


def _tokenizer(folder) -> transformers.PreTrainedTokenizerFast:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=380,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|endoftext|>",
    )


def _build(name: str, folder):
    case = CASES[name]
    fast = _tokenizer(folder)
    processor = transformers.Idefics3Processor(
        image_processor=case["image_processor"], tokenizer=fast, image_seq_len=TOKENS_PER_TILE, chat_template=TEMPLATE
    )
    processor.save_pretrained(folder)
    text = transformers.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=case["tied"],
    )
    config = case["config_class"](
        text_config=text.to_dict(),
        vision_config=case["vision"].to_dict(),
        image_token_id=fast.convert_tokens_to_ids("<image>"),
        scale_factor=case["scale_factor"],
        tie_word_embeddings=case["tied"],
    )
    torch.manual_seed(0)
    hf = case["hf_class"](config).eval()
    with torch.no_grad():  # random init leaves the connector tiny; make the image rows matter to the logits
        hf.model.connector.modality_projection.proj.weight.normal_(0, 0.3)
    hf.save_pretrained(folder)
    return hf, processor


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf, processor = _build(request.param, folder)
    return request.param, hf, processor, Model.load(folder, dtype=torch.float32), folder


def picture(size: tuple[int, int], colour: str, seed: int) -> Image.Image:
    """Noise with a shape on it, so every tile differs and resizing has detail to work on."""
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    ImageDraw.Draw(img).ellipse((size[0] // 5, size[1] // 6, size[0] * 3 // 4, size[1] * 4 // 5), fill=colour)
    return img


BIG = picture((61, 40), "red", 1)  # cut into tiles in both cases
SMALL = picture((20, 14), "green", 2)  # one tile under SmolVLM's config (cut under Idefics3's 48 px resize)


def _messages(*parts):
    return [
        {"role": "user", "content": [{"type": "image"} if p is None else {"type": "text", "text": p} for p in parts]}
    ]


def _ours(model, messages, images):
    """Our prompt ids [n] (image runs as alias ids) and embeddings for a chat with these pictures."""
    tok = model.tokenizer
    embeddings = [model.vision.get_image_embeddings(model=model, tokenizer=tok, image=img) for img in images]
    text = render_with_images(
        ChatTemplate.from_tokenizer(tok), messages, embeddings, placeholder=model.vision.image_placeholder
    )
    return tok.encode(text, encode_special_tokens=True, embeddings=embeddings)[0], embeddings


def _reference(processor, messages, images):
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    return processor(text=text, images=[images], return_tensors="pt")


def _expanded(model, ids, embeddings, images):
    """`ids` with each image's alias run replaced by the token ids of its prompt text."""
    out = ids.tolist()
    for emb, img in zip(embeddings, images):
        split = model.vision.processor(img)
        marker_ids = model.vision.prompt_ids(model.tokenizer, split.rows, split.cols, TOKENS_PER_TILE).tolist()
        start = out.index(emb.first_id)
        out[start : start + emb.num_tokens] = marker_ids
    return out


def _logits(model, ids, embeddings):
    cache = Cache(model, max_seq_len=16 * 24, page_size=16)
    table = [list(range(23, -1, -1))[: (len(ids) + 15) // 16]]  # pages out of order
    batch = Batch.build(cache, table, [0], [len(ids)], logits="all")
    x = splice_inputs(model, ids, [(0, len(ids), embeddings)])
    return model(x, batch.positions(), batch)


def test_structure(pair):
    name, hf, _, ours, _ = pair
    assert isinstance(ours, Idefics3ForConditionalGeneration)
    assert ours.config.architecture == hf.config.architectures[0]
    assert model_class(hf.config.architectures[0]) is Idefics3ForConditionalGeneration
    assert vision_of(ours) is ours.vision is ours.vision_model
    assert ours.image_token_id == hf.config.image_token_id
    assert ours.tokens_per_image == hf.model.image_seq_len
    assert ours.vision.image_placeholder == "<image>"
    assert len(ours.tokenizer.encode("\n\n")[0]) == 1  # the merge between the last tile row and the global image
    if CASES[name]["tied"]:
        assert ours.language_model.lm_head.weight is ours.language_model.model.embed_tokens.weight


def test_tiles_and_image_features_match(pair):
    name, hf, processor, ours, _ = pair
    for img in (BIG, SMALL):
        ref = processor.image_processor(images=[[img]], return_tensors="pt", return_row_col_info=True)
        split = ours.vision.processor(img)
        assert (split.rows, split.cols) == (ref["rows"][0][0], ref["cols"][0][0])
        torch.testing.assert_close(split.pixel_values, ref["pixel_values"][0], atol=1e-6, rtol=0)
        with torch.no_grad():
            features = hf.model.get_image_features(ref["pixel_values"], ref["pixel_attention_mask"]).pooler_output
        got = ours.encode_images(split.pixel_values)
        assert got.shape == (split.num_tiles, TOKENS_PER_TILE, HIDDEN)
        torch.testing.assert_close(got.reshape(-1, HIDDEN), torch.cat(list(features)), atol=1e-5, rtol=1e-5, msg=name)
    assert ours.vision.processor(BIG).rows > 0
    if name == "smolvlm":
        assert ours.vision.processor(SMALL).rows == 0  # the single-tile prompt form is exercised too


@pytest.mark.parametrize("images", [(BIG,), (BIG, SMALL)], ids=["one-image", "two-images"])
def test_chat_prompt_ids_and_logits_match(pair, images):
    name, hf, processor, ours, _ = pair
    messages = _messages(*([None] * len(images)), "what colour is the circle?")
    ids, embeddings = _ours(ours, messages, images)
    ref = _reference(processor, messages, list(images))
    assert _expanded(ours, ids, embeddings, images) == ref["input_ids"][0].tolist()
    with torch.no_grad():
        expected = hf(**ref).logits[0]
    torch.testing.assert_close(_logits(ours, ids, embeddings), expected, atol=1e-4, rtol=1e-4, msg=name)


def test_image_rows_are_the_transformers_input_embeddings(pair, tmp_path):
    name, hf, processor, ours, _ = pair
    BIG.save(tmp_path / "big.png")
    ref = _reference(processor, _messages(None, "hi"), [BIG])
    with torch.no_grad():
        embeds = hf.model.text_model.get_input_embeddings()(ref["input_ids"])[0]
        features = torch.cat(
            list(hf.model.get_image_features(ref["pixel_values"], ref["pixel_attention_mask"]).pooler_output)
        )
    embeds[ref["input_ids"][0] == hf.config.image_token_id] = features
    # exllamav2's call shape, with each kind of image source.
    for source in (BIG, tmp_path / "big.png", (tmp_path / "big.png").read_bytes()):
        emb = ours.vision_model.get_image_embeddings(
            model=ours, tokenizer=ours.tokenizer, image=source, text_alias="<p>"
        )
        start = ref["input_ids"][0].tolist().index(processor.fake_image_token_id)
        assert emb.text_alias == "<p>" and emb.embeddings.dtype == ours.dtype
        torch.testing.assert_close(
            emb.embeddings, embeds[start : start + emb.num_tokens], atol=1e-5, rtol=1e-5, msg=name
        )
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


def test_image_job_matches_transformers_greedy(pair):
    name, hf, processor, ours, _ = pair
    messages = _messages(None, "describe the picture")
    ids, embeddings = _ours(ours, messages, [BIG])
    job = DynamicJob(ids[None], 32, gen_settings=SamplerSettings.greedy(), identifier="a", embeddings=embeddings)
    got = tokens(run(make_gen(ours), [job])["a"])
    ref = _reference(processor, messages, [BIG])
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


@pytest.mark.parametrize(
    "changes, error, message",
    [
        ({"vision_config.hidden_act": "mish7"}, ModelLoadError, "'mish7'"),
        ({"text_config.model_type": "gemma9"}, UnsupportedArchitectureError, "'gemma9'"),
        ({"scale_factor": 0}, ModelLoadError, "scale_factor"),
        ({"scale_factor": "two"}, ModelLoadError, "scale_factor"),
        ({"image_token_id": "<image>"}, ModelLoadError, "image_token"),
        # A different pixel shuffle needs a connector of another width than the checkpoint's.
        ({"scale_factor": 1}, TensorMismatchError, "modality_projection"),
    ],
)
def test_bad_configs_are_named(pair, tmp_path, changes, error, message):
    _, _, _, _, folder = pair
    with pytest.raises(error, match=message):
        Model.load(_edited_folder(folder, tmp_path, **changes), dtype=torch.float32)


def test_missing_tensors_are_named(pair, tmp_path):
    _, _, _, _, folder = pair
    saved = load_file(folder / "model.safetensors")
    for missing, message in (
        ("model.connector.modality_projection.proj.weight", "modality_projection.proj.weight"),
        ("model.vision_model.post_layernorm.weight", "post_layernorm.weight"),
    ):
        target = tmp_path / missing
        target.mkdir()
        (target / "config.json").write_text((folder / "config.json").read_text())
        save_file({k: v for k, v in saved.items() if k != missing}, target / "model.safetensors")
        with pytest.raises(TensorMismatchError, match=message):
            Model.load(target, dtype=torch.float32)


def test_processor_that_disagrees_with_the_tower_is_named(pair, tmp_path):
    _, _, _, _, folder = pair
    edited = _edited_folder(folder, tmp_path, file="processor_config.json", image_seq_len=TOKENS_PER_TILE + 1)
    model = Model.load(edited, dtype=torch.float32)
    with pytest.raises(ValueError, match="image_seq_len=5"):
        model.vision.get_image_embeddings(image=SMALL)


def test_tokenizer_without_the_image_markers_is_refused(pair):
    _, _, _, ours, _ = pair
    plain = HFTokenizer(models.BPE())
    plain.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    plain.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=280, show_progress=False))
    with pytest.raises(ValueError, match="fake_token_around_image"):
        ours.vision.get_image_embeddings(tokenizer=Tokenizer(plain), image=SMALL)


def test_config_without_text_config_takes_transformers_defaults():
    vision = {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1, "image_size": 64}
    for arch, ref_class in (
        ("Idefics3ForConditionalGeneration", transformers.Idefics3Config),
        ("SmolVLMForConditionalGeneration", transformers.SmolVLMConfig),
    ):
        config = ModelConfig.from_hf_dict({"architectures": [arch], "vision_config": vision})
        ref = ref_class(vision_config=vision)
        with torch.device("meta"):
            model = Idefics3ForConditionalGeneration(config)
        assert model.config.rms_norm_eps == ref.text_config.rms_norm_eps
        assert model.image_token_id == ref.image_token_id
        assert model.scale_factor == ref.scale_factor
        grid = ref.vision_config.image_size // ref.vision_config.patch_size
        assert model.tokens_per_image == grid**2 // ref.scale_factor**2
        assert model.vision_tower.config.intermediate_size == ref.vision_config.intermediate_size
        assert model.vision_tower.config.patch_size == ref.vision_config.patch_size


def test_unsupported_vision_language_architecture_is_named():
    with pytest.raises(UnsupportedArchitectureError, match="'Idefics2ForConditionalGeneration'"):
        model_class("Idefics2ForConditionalGeneration")


# --- counting an image's tokens for the context meter --------------------------------------------------------


@pytest.mark.parametrize("size", [(61, 40), (20, 14), (7, 90), (120, 80), (24, 24)])
def test_image_token_count_needs_no_vision_tower(pair, size):
    # A model built without weights and without its vision tower counts what the real one embeds: its tiles,
    # the global image and every marker token, from the picture's size and the tokenizer.
    _, _, processor, ours, folder = pair
    with torch.device("meta"):
        bare = Idefics3ForConditionalGeneration(ModelConfig.from_file(folder / "config.json"))
    bare.source_path, bare.vision_tower = folder, None
    image = picture(size, "red", 3)
    assert bare.vision.count_image_tokens(image) == ours.vision.get_image_embeddings(image=image).num_tokens
    # A chat rendered around the stand-in is as long as transformers' processor makes it.
    messages, tok = _messages(None, "what colour is the circle?"), ours.tokenizer
    stand_in = bare.vision.stand_in(image)
    text = render_with_images(
        ChatTemplate.from_tokenizer(tok), messages, [stand_in], placeholder=ours.vision.image_placeholder
    )
    ids = tok.encode(text, encode_special_tokens=True, embeddings=[stand_in])[0]
    assert len(ids) == _reference(processor, messages, [image])["input_ids"].shape[-1]
