"""Gemma 3 with images (Gemma3ForConditionalGeneration) against transformers: pixels, image features, logits and
greedy tokens of image+text prompts with the image tokens attending to each other both ways, the chat
template's image text, image jobs in the DynamicGenerator (two images, chunk limits, shared images), and counting
an image's ids and its chat's length without the vision tower (square, wide, tall and tiny pictures)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers
from PIL import Image, ImageDraw
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from engine.cache import Cache
from engine.chat_template import ChatTemplate
from engine.config.model import ModelConfig
from engine.errors import ModelLoadError, UnsupportedArchitectureError
from engine.generator.dynamic import DynamicGenerator
from engine.generator.images import splice_inputs
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Batch, Model
from engine.models.gemma3.model import Gemma3ForConditionalGeneration
from engine.models.llava.processor import ImageProcessor
from engine.vision.embedding import is_mm_id
from engine.vision.handle import vision_of
from engine.vision.prompt import render_with_images

SPECIAL = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"]
IMAGE_TOKEN = "<image_soft_token>"
MM_TOKENS = 16  # 32x32 pixels, 4x4 patches: an 8x8 grid pooled 2x2
IMAGE_SIZE = 32
# Gemma 3's chat template as released (google/gemma-3-*-it): images print as <start_of_image>.
TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""
# Blank-line runs of several lengths, so the tokenizer learns "\n\n\n" and "\n\n\n\n" as single tokens: the
# blank lines around an image merge with the text before it, which the token test must get right.
CORPUS = [
    "user\n\n\nDescribe this picture.\n\nmodel\nA red circle on white.\n\n\n\n",
    "You are terse.\n\n\n\nWhat is in the image? Compare them.\n\nTell me.\n\n\n\n\n\n\n\n",
]


def _build(folder) -> transformers.Gemma3ForConditionalGeneration:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[*SPECIAL, IMAGE_TOKEN],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "pad_token": "<pad>",
                "extra_special_tokens": {
                    "boi_token": "<start_of_image>",
                    "eoi_token": "<end_of_image>",
                    "image_token": IMAGE_TOKEN,
                },
                "chat_template": TEMPLATE,
            }
        )
    )
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    image_processor = transformers.Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = transformers.Gemma3Processor(image_processor, hf_tokenizer, image_seq_length=MM_TOKENS)
    processor.save_pretrained(folder)  # processor_config.json with the image processor nested, as shipped

    text = transformers.Gemma3TextConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        query_pre_attn_scalar=20,
        sliding_window=6,  # shorter than an image's 18 tokens
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
        },
        max_position_embeddings=512,
        initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
    )
    vision = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=4,
        vision_use_head=False,
    )
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=MM_TOKENS,
        boi_token_index=tok.token_to_id("<start_of_image>"),
        eoi_token_index=tok.token_to_id("<end_of_image>"),
        image_token_index=tok.token_to_id(IMAGE_TOKEN),
    )
    torch.manual_seed(3)
    hf = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms start at a scale of exactly 1 and the projector at zero: make both matter
        for name, p in hf.named_parameters():
            if "norm" in name and "vision_tower" not in name:
                p.normal_(0, 0.3)
        hf.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.3)
    hf.save_pretrained(folder)
    return hf


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3")
    _build(folder)
    return folder


@pytest.fixture(scope="module")
def hf(folder):
    return transformers.Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def processor(folder):
    return transformers.AutoProcessor.from_pretrained(folder)


@pytest.fixture(scope="module")
def ours(folder):
    return Model.load(folder, dtype=torch.float32)


def picture(colour: str, box=(4, 4, 24, 20), size=(40, 30)) -> Image.Image:
    img = Image.new("RGB", size, "white")
    ImageDraw.Draw(img).ellipse(box, fill=colour)
    return img


def to_reference_ids(model, ids: list[int], embeddings) -> list[int]:
    """Our prompt ids with each image run written as the reference writes it: boi, image tokens, eoi."""
    out = []
    for t in ids:
        if not is_mm_id(t):
            out.append(t)
            continue
        e = next(e for e in embeddings if e.owns(t))
        row = t - e.first_id
        out.append(
            model.boi_token_id if row == 0 else model.eoi_token_id if row == e.num_tokens - 1 else model.image_token_id
        )
    return out


def reference_inputs(model, processor, ids: list[int], embeddings, images) -> dict:
    """transformers' inputs for the same prompt: its ids, its processor's pixels, and token_type_ids."""
    hf_ids = torch.tensor([to_reference_ids(model, ids, embeddings)])
    pixels = processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
    token_types = (hf_ids == model.image_token_id).long()  # what the processor returns as token_type_ids
    return dict(input_ids=hf_ids, pixel_values=pixels, token_type_ids=token_types)


def chat_ids(model, messages, embeddings) -> list[int]:
    """The app's path: render the template, put each image's text where it wrote the placeholder, encode."""
    tokenizer = model.tokenizer
    text = render_with_images(
        ChatTemplate.from_tokenizer(tokenizer), messages, embeddings, placeholder=model.vision.image_placeholder
    )
    return tokenizer.encode(text, encode_special_tokens=True, embeddings=embeddings)[0].tolist()


def message(text: str, num_images: int, system: str | None = "You are terse.") -> list[dict]:
    user = {
        "role": "user",
        "content": [*({"type": "image"} for _ in range(num_images)), {"type": "text", "text": text}],
    }
    return ([{"role": "system", "content": system}] if system else []) + [user]


# --- structure and the image side ---------------------------------------------------------------------------


def test_structure(ours, hf):
    assert isinstance(ours, Gemma3ForConditionalGeneration)
    assert ours.tokens_per_image == MM_TOKENS + 2
    assert (ours.boi_token_id, ours.eoi_token_id, ours.image_token_id) == (
        hf.config.boi_token_index,
        hf.config.eoi_token_index,
        hf.config.image_token_index,
    )
    assert vision_of(ours) is ours.vision is ours.vision_model
    assert ours.vision.image_placeholder == "<start_of_image>"
    lm = ours.language_model
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # Gemma 3 ties its embeddings


def test_image_features_match(ours, hf):
    pixels = torch.randn(3, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf.get_image_features(pixel_values=pixels).pooler_output
    got = ours.encode_images(pixels)
    assert got.shape == (3, MM_TOKENS, 64)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def _varied_images() -> dict[str, Image.Image]:
    rng = np.random.default_rng(5)
    rgba = rng.integers(0, 256, (50, 60, 4), dtype=np.uint8)
    rgba[:10, :, 3] = 0  # transparent band: composited on white like the reference
    return {
        "noise_333x517": Image.fromarray(rng.integers(0, 256, (333, 517, 3), dtype=np.uint8)),
        "very_wide_900x40": Image.fromarray(rng.integers(0, 256, (40, 900, 3), dtype=np.uint8)),
        "tiny_7x5": Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)),
        "one_pixel": Image.new("RGB", (1, 1), (200, 30, 90)),
        "drawn": picture("red"),
        "rgba": Image.fromarray(rgba, "RGBA"),
        "gray": Image.fromarray(rng.integers(0, 256, (48, 64), dtype=np.uint8), "L"),
        "palette": picture("blue").convert("P", palette=Image.Palette.ADAPTIVE),
    }


@pytest.mark.parametrize(
    "config",
    [
        None,  # the model folder's own (processor_config.json, 32x32)
        {"image_processor_type": "Gemma3ImageProcessor"},  # class defaults: 224x224, bilinear
        {"image_processor_type": "Gemma3ImageProcessor", "size": 40, "do_pan_and_scan": None},  # int: a square
        {"image_processor_type": "Gemma3ImageProcessorFast", "size": {"height": 24, "width": 56}, "resample": 3},
    ],
    ids=["folder", "defaults", "int-size", "bicubic-rect"],
)
def test_pixel_values_match_the_transformers_processor(folder, tmp_path, config):
    if config is not None:
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
        folder = tmp_path
    reference = transformers.Gemma3ImageProcessorPil.from_pretrained(folder)
    ours = ImageProcessor.from_folder(folder)
    for name, image in _varied_images().items():
        expected = reference(image, return_tensors="pt")["pixel_values"][0]
        torch.testing.assert_close(ours(image), expected, atol=1e-5, rtol=0, msg=name)


def test_pan_and_scan_is_refused_by_name():
    config = {"image_processor_type": "Gemma3ImageProcessor", "do_pan_and_scan": True}
    with pytest.raises(ValueError, match="do_pan_and_scan=True is not supported"):
        ImageProcessor.from_dict(config)
    assert ImageProcessor.from_dict({**config, "do_pan_and_scan": False}).resize_hw == (224, 224)


def test_get_image_embeddings_rows(ours, hf, processor):
    img = picture("orange")
    emb = ours.vision.get_image_embeddings(model=ours, tokenizer=None, image=img, text_alias="<pic>")
    assert emb.num_tokens == ours.tokens_per_image and emb.text_alias == "<pic>"
    assert emb.prompt_text == "\n\n<pic>\n\n"
    pixels = processor.image_processor(images=[img], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        features = hf.get_image_features(pixel_values=pixels).pooler_output[0]
        boi_eoi = hf.get_input_embeddings()(torch.tensor([hf.config.boi_token_index, hf.config.eoi_token_index]))
    torch.testing.assert_close(emb.embeddings[1:-1], features, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(emb.embeddings[[0, -1]], boi_eoi, atol=0, rtol=0)
    assert ours.vision.get_image_embeddings(image=img.copy()).first_id == emb.first_id
    assert ours.vision.get_image_embeddings(image=picture("green")).first_id != emb.first_id


# --- the chat template -------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_images, system", [(1, "You are terse."), (2, None)])
def test_chat_prompt_tokens_match_the_processor(ours, processor, num_images, system):
    images = [picture("red"), picture("purple", box=(10, 2, 30, 22))][:num_images]
    embeddings = [ours.vision.get_image_embeddings(image=img) for img in images]
    messages = message("Compare them." if num_images > 1 else "What is in the image?", num_images, system)
    ids = chat_ids(ours, messages, embeddings)

    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.count("<start_of_image>") == num_images
    expected = processor(text=text, images=[images], add_special_tokens=False)["input_ids"][0]
    assert to_reference_ids(ours, ids, embeddings) == list(expected)
    # The blank lines before each image merged with the text before it into one token, in both.
    merged = {processor.tokenizer.convert_tokens_to_ids(t) for t in ("ĊĊĊ", "ĊĊĊĊ")}
    assert sum(t in merged for t in expected) == num_images


# --- logits and greedy tokens against transformers ----------------------------------------------------------


def _prompt_with_images(ours, images, seed: int, before: int = 5, between: int = 3, after: int = 7):
    """[bos, text, image run, text, (image run, text)] with random text ids; returns (ids, embeddings)."""
    g = torch.Generator().manual_seed(seed)
    embeddings = [ours.vision.get_image_embeddings(image=img) for img in images]
    text = lambda n: torch.randint(9, 250, (n,), generator=g).tolist()  # noqa: E731
    ids = [2, *text(before)]
    for i, e in enumerate(embeddings):
        ids += e.get_ids()[0].tolist() + text(after if i == len(embeddings) - 1 else between)
    return ids, embeddings


def _forward_all(ours, prompts, tables, cache, with_ids=True):
    batch = Batch.build(cache, tables, [0] * len(prompts), [len(p) for p, _ in prompts], logits="all")
    ids = torch.tensor([t for p, _ in prompts for t in p])
    runs, start = [], 0
    for p, embeddings in prompts:
        runs.append((start, len(p), embeddings))
        start += len(p)
    inputs = splice_inputs(ours, ids, runs)
    return ours(inputs, batch.positions(), replace(batch, token_ids=ids) if with_ids else batch)


def test_image_prompt_logits_match(ours, hf, processor):
    one = [picture("red")]
    two = [picture("green"), picture("purple", box=(12, 6, 30, 28))]
    prompts = [_prompt_with_images(ours, one, seed=2), _prompt_with_images(ours, two, seed=3)]
    cache = Cache(ours, max_seq_len=16 * 8, page_size=8)
    tables = [[0, 2, 4, 6], [1, 3, 5, 7, 9, 11, 13]]  # interleaved pages
    logits = _forward_all(ours, prompts, tables, cache)
    causal = _forward_all(ours, prompts, tables, cache, with_ids=False)
    start = 0
    for (ids, embeddings), images in zip(prompts, (one, two)):
        with torch.no_grad():
            ref = hf(**reference_inputs(ours, processor, ids, embeddings, images)).logits[0]
        got = logits[start : start + len(ids)]
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        # Without the image tokens seeing each other both ways, everything from the image on is different.
        assert (causal[start : start + len(ids)] - ref).abs().max() > 1e-2
        start += len(ids)


def test_chunk_ending_inside_an_image_is_refused(ours):
    ids, embeddings = _prompt_with_images(ours, [picture("red")], seed=4)
    cache = Cache(ours, max_seq_len=64, page_size=8)
    batch = Batch.build(cache, [[0, 1, 2, 3]], [0], [10])  # 6 text ids, then 4 of the 18 image ids
    head = torch.tensor(ids[:10])
    inputs = splice_inputs(ours, head, [(0, 10, embeddings)])
    with pytest.raises(ValueError, match="prefill chunk ends inside an image"):
        ours(inputs, batch.positions(), replace(batch, token_ids=head))


def test_chunk_starting_inside_a_cached_image_matches_one_pass(ours):
    # A later job can share the pages of an image's first rows (computed whole by an earlier job) and start
    # its prefill inside the image: those rows still look ahead to the image's end, found from their ids.
    ids, embeddings = _prompt_with_images(ours, [picture("teal")], seed=6)  # image ids at 6..23
    prompt = torch.tensor(ids)
    cache = Cache(ours, max_seq_len=8 * 12, page_size=8)
    one_pass = _forward_all(ours, [(ids, embeddings)], [[0, 1, 2, 3]], cache)
    batch = Batch.build(cache, [[0, 1, 4, 5]], [16], [len(ids) - 16], logits="all")  # pages 0-1 shared
    inputs = splice_inputs(ours, prompt[16:], [(0, len(ids) - 16, embeddings)])
    rest = ours(inputs, batch.positions(), replace(batch, token_ids=prompt[16:]))
    torch.testing.assert_close(rest, one_pass[16:], atol=1e-5, rtol=1e-5)


def test_greedy_tokens_match(ours, hf, processor):
    steps = 32
    images = [picture("navy", box=(2, 8, 30, 26))]
    ids, embeddings = _prompt_with_images(ours, images, seed=5)
    cache = Cache(ours, max_seq_len=8 * 10, page_size=8)
    table = [[7, 1, 5, 0, 9, 6, 2, 4]]
    prompt = torch.tensor(ids)
    batch = Batch.build(cache, table, [0], [len(ids)])
    inputs = splice_inputs(ours, prompt, [(0, len(ids), embeddings)])
    next_id = ours(inputs, batch.positions(), replace(batch, token_ids=prompt)).argmax(-1)
    generated, past = [int(next_id)], len(ids)
    for _ in range(steps - 1):
        batch = Batch.build(cache, table, [past], [1])
        next_id = ours(next_id, batch.positions(), batch).argmax(-1)
        past += 1
        generated.append(int(next_id))
    with torch.no_grad():
        ref = hf.generate(
            **reference_inputs(ours, processor, ids, embeddings, images),
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=None,
        )
    assert generated == ref[0, len(ids) :].tolist()


# --- the generator -------------------------------------------------------------------------------------------


def make_gen(model, pages=48, page_size=8, max_chunk_size=None):
    cache = Cache(model, max_seq_len=pages * page_size, page_size=page_size)
    return DynamicGenerator(model, cache, model.tokenizer, max_chunk_size=max_chunk_size)


def run(gen, jobs) -> dict:
    gen.enqueue(jobs)
    out: dict[object, list[dict]] = {j.identifier: [] for j in jobs}
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            out[r["identifier"]].append(r)
    return out


def tokens(results) -> list[int]:
    return [t for r in results if "token_ids" in r for t in r["token_ids"][0].tolist()]


@pytest.mark.parametrize("num_images", [1, 2])
def test_generator_image_job_matches_transformers(ours, hf, processor, num_images):
    steps = 32
    images = [picture("red"), picture("purple", box=(12, 6, 30, 28))][:num_images]
    embeddings = [ours.vision.get_image_embeddings(model=ours, tokenizer=ours.tokenizer, image=i) for i in images]
    ids = chat_ids(ours, message("Compare them.", num_images), embeddings)
    job = DynamicJob(
        torch.tensor([ids]),
        steps,
        gen_settings=SamplerSettings.greedy(),
        return_logits=True,
        identifier="a",
        embeddings=embeddings,
    )
    # Chunks of 8 would cut every image: the generator must keep each image's ids in one forward.
    results = run(make_gen(ours, max_chunk_size=8), [job])["a"]
    reference = reference_inputs(ours, processor, ids, embeddings, images)
    with torch.no_grad():
        ref_logits = hf(**reference).logits[0, -1]
        ref = hf.generate(**reference, max_new_tokens=steps, do_sample=False, eos_token_id=None)
    assert tokens(results) == ref[0, len(ids) :].tolist()
    # Greedy picks survive small errors; the prompt's logits show the image tokens saw each other.
    first_logits = next(r["logits"][0, 0] for r in results if r.get("logits") is not None and r["logits"].shape[1])
    torch.testing.assert_close(first_logits, ref_logits, atol=1e-4, rtol=1e-4)


def test_same_image_in_two_concurrent_jobs_is_computed_once(ours):
    img = picture("red")
    tok = ours.tokenizer

    def job(question: str, ident: str) -> DynamicJob:
        e = ours.vision.get_image_embeddings(model=ours, tokenizer=tok, image=img.copy())
        ids = chat_ids(ours, message(question, 1), [e])
        settings = SamplerSettings.greedy()
        return DynamicJob(
            torch.tensor([ids]), 8, gen_settings=settings, return_logits=True, identifier=ident, embeddings=[e]
        )

    questions = {"first": "What is in the image?", "second": "Describe this picture."}
    solo = {name: run(make_gen(ours), [job(q, name)])[name] for name, q in questions.items()}
    second = job(questions["second"], "second")
    image_end = max(i for i, t in enumerate(second.prompt_ids) if is_mm_id(t)) + 1

    both = run(make_gen(ours), [job(q, name) for name, q in questions.items()])
    assert both["first"][-1]["cached_tokens"] == 0
    assert both["second"][-1]["cached_tokens"] >= image_end  # the text before and the whole image reused
    for name in questions:
        assert tokens(both[name]) == tokens(solo[name]), name
        torch.testing.assert_close(both[name][-1]["logits"], solo[name][-1]["logits"], atol=1e-5, rtol=1e-5)


# --- configs -------------------------------------------------------------------------------------------------

# google/gemma-3-4b-it's config.json: the text_config holds only what differs from the defaults.
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


def test_sparse_released_config_takes_transformers_defaults():
    config = ModelConfig.from_hf_dict(json.loads(json.dumps(GEMMA3_4B)))
    ref = transformers.Gemma3Config(**{k: v for k, v in GEMMA3_4B.items() if k != "architectures"})
    text = ref.text_config
    fields = (
        "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads "
        "head_dim rms_norm_eps max_position_embeddings sliding_window bos_token_id"
    ).split()
    assert {f: getattr(config, f) for f in fields} == {f: getattr(text, f) for f in fields}
    assert config.tie_word_embeddings and config.image_token_id == ref.image_token_index
    with torch.device("meta"):
        model = Gemma3ForConditionalGeneration(config)
    settings = model.language_model.settings
    assert settings.is_sliding == tuple(t == "sliding_attention" for t in text.layer_types)
    assert settings.query_pre_attn_scalar == text.query_pre_attn_scalar
    full, local = text.rope_parameters["full_attention"], text.rope_parameters["sliding_attention"]
    assert (settings.global_rope.theta, settings.global_rope.scaling.factor) == (full["rope_theta"], full["factor"])
    assert (settings.local_rope.theta, settings.local_rope.scaling) == (local["rope_theta"], None)
    assert model.tokens_per_image == ref.mm_tokens_per_image + 2
    assert model.multi_modal_projector.kernel == 4  # 64 patches per side pooled to 16


def _edited(folder, tmp_path, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        section, _, field = key.rpartition(".")
        (config[section] if section else config)[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")


@pytest.mark.parametrize(
    "changes, error, message",
    [
        ({"vision_config.model_type": "clip_vision_model"}, UnsupportedArchitectureError, "'clip_vision_model'"),
        ({"text_config.model_type": "llama"}, UnsupportedArchitectureError, "'LlamaForCausalLM'"),
        ({"mm_tokens_per_image": 15}, ModelLoadError, "mm_tokens_per_image=15"),
        ({"mm_tokens_per_image": 9}, ModelLoadError, "mm_tokens_per_image=9"),  # 3 does not divide 8 patches
        ({"boi_token_index": "<start_of_image>"}, ModelLoadError, "boi_token_index"),
        ({"text_config.attn_logit_softcapping": 30.0}, ModelLoadError, "attn_logit_softcapping"),
    ],
)
def test_bad_configs_are_named(folder, tmp_path, changes, error, message):
    _edited(folder, tmp_path, **changes)
    with pytest.raises(error, match=message):
        Model.load(tmp_path, dtype=torch.float32)


# --- counting an image's tokens for the context meter --------------------------------------------------------


@pytest.mark.parametrize("size", [(40, 30), (7, 90), (300, 200), (32, 32)])
def test_image_token_count_needs_no_vision_tower(folder, ours, size):
    # A model built without weights and without its vision tower counts what the real one embeds.
    with torch.device("meta"):
        bare = Gemma3ForConditionalGeneration(ModelConfig.from_file(folder / "config.json"))
    bare.source_path, bare.vision_tower = folder, None
    image = picture("red", size=size)
    real = ours.vision.get_image_embeddings(image=image)
    assert bare.vision.count_image_tokens(image) == real.num_tokens == MM_TOKENS + 2
    # The stand-in renders with the same blank lines around it, so the chat has the real one's length.
    stand_in = bare.vision.stand_in(image)
    assert len(chat_ids(ours, message("hi", 1), [stand_in])) == len(chat_ids(ours, message("hi", 1), [real]))
