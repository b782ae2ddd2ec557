"""Qwen2-VL and Qwen2.5-VL against transformers: image features (2-D rotary ViT, windows, patch merger), M-RoPE
positions (whole prompts, chunks, decode, cached prefixes), chat prompt ids, logits and greedy tokens of image+text
prompts, image jobs in the DynamicGenerator (two images, small chunks, shared images, prefix reuse), and counting an
image's ids without the vision model (pictures under min_pixels, over max_pixels, tall, wide, EXIF-rotated)."""

from __future__ import annotations

import json
from dataclasses import replace

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
from engine.models.qwen2_vl import (
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageEmbedding,
)
from engine.models.qwen2_vl.processor import Qwen2VLImageProcessor
from engine.vision.embedding import MMEmbedding, is_mm_id
from engine.vision.handle import vision_of
from engine.vision.prompt import render_with_images

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Qwen2-VL-*-Instruct's chat template as released (Qwen2.5-VL ships the same one).
TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "system\nYou are a helpful assistant.\nuser\nWhat is in the image? Describe this picture.\nassistant\n",
    "A red circle on white. Compare them, tell me which one is bigger and why.\n",
]
# 4-pixel patches merged 2x2: image sides are multiples of 8 pixels, 4..30 image tokens.
PROCESSOR = dict(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=8 * 8 * 4, max_pixels=8 * 8 * 30)
VISION = {
    "qwen2_vl": dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=4),
    # Windows of 16 pixels: 2x2 merged blocks, so images have whole, cut and single-block windows.
    "qwen2_5_vl": dict(
        depth=3,
        hidden_size=32,
        intermediate_size=48,
        out_hidden_size=64,
        num_heads=2,
        patch_size=4,
        window_size=16,
        fullatt_block_indexes=[1],
    ),
}
CLASSES = {
    "qwen2_vl": (transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration),
    "qwen2_5_vl": (transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration),
}


class ReferenceProcessor(transformers.Qwen2VLProcessor):
    """transformers' processor without its video half, whose class needs torchvision (not installed here)."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


def _build(folder, kind: str):
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": TEMPLATE,
            }
        )
    )
    transformers.Qwen2VLImageProcessorPil(**PROCESSOR).save_pretrained(folder)
    text = dict(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        # 8 rotary frequencies: 2 turned by time, 3 by height, 3 by width; a small theta makes positions matter.
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 100.0},
        max_position_embeddings=512,
        initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"),
    )
    config_cls, model_cls = CLASSES[kind]
    config = config_cls(
        text_config=text,
        vision_config={**VISION[kind], "initializer_range": 0.1},
        image_token_id=tok.token_to_id("<|image_pad|>"),
        video_token_id=tok.token_to_id("<|video_pad|>"),
        vision_start_token_id=tok.token_to_id("<|vision_start|>"),
        vision_end_token_id=tok.token_to_id("<|vision_end|>"),
    )
    torch.manual_seed(7)
    hf = model_cls(config).eval()
    with torch.no_grad():  # norms start at exactly 1: make them matter too
        for name, p in hf.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.normal_(1.0, 0.3)
    hf.save_pretrained(folder)


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def folder(tmp_path_factory, kind):
    folder = tmp_path_factory.mktemp(kind)
    _build(folder, kind)
    return folder


@pytest.fixture(scope="module")
def hf(folder, kind):
    return CLASSES[kind][1].from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def processor(folder):
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    image_processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
    return ReferenceProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=TEMPLATE)


@pytest.fixture(scope="module")
def ours(folder):
    return Model.load(folder, dtype=torch.float32)


def picture(colour: str, box=(4, 4, 24, 20), size=(40, 30)) -> Image.Image:
    img = Image.new("RGB", size, "white")
    ImageDraw.Draw(img).ellipse(box, fill=colour)
    return img


RED = picture("red")  # 40x30 -> 40x32 pixels: 8 x 10 patches, 4 x 5 tokens
TALL = picture("blue", box=(2, 10, 20, 50), size=(23, 61))  # -> 24x64 pixels: 8 x 3 tokens
WIDE = picture("green", box=(8, 4, 150, 30), size=(160, 40))  # over 30 tokens: down to 80x16 pixels, 2 x 10


def message(text: str, num_images: int) -> list[dict]:
    content = [*({"type": "image"} for _ in range(num_images)), {"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


def chat_ids(model, messages, embeddings) -> list[int]:
    """The app's path: render the template, put each image's text where it wrote the placeholder, encode."""
    tokenizer = model.tokenizer
    text = render_with_images(
        ChatTemplate.from_tokenizer(tokenizer), messages, embeddings, placeholder=model.vision.image_placeholder
    )
    return tokenizer.encode(text, encode_special_tokens=True, embeddings=embeddings)[0].tolist()


def reference_inputs(model, processor, ids: list[int], images) -> dict:
    """transformers' inputs for the same prompt: image ids as <|image_pad|>, its processor's pixels and grids."""
    hf_ids = torch.tensor([[model.image_token_id if is_mm_id(t) else t for t in ids]])
    inputs = dict(input_ids=hf_ids, mm_token_type_ids=(hf_ids == model.image_token_id).long())
    if images:
        inputs.update(processor.image_processor(images=images, return_tensors="pt"))
    return inputs


def reference_positions(hf, inputs) -> torch.Tensor:
    """[3, L] positions transformers computes for a prompt (plain ones for text only)."""
    if "image_grid_thw" not in inputs:
        return torch.arange(inputs["input_ids"].shape[1]).expand(3, -1)
    positions, _ = hf.model.get_rope_index(
        inputs["input_ids"], inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"]
    )
    return positions[:, 0]


def forward(model, ids: list[int], embeddings, positions=None, past: int = 0, table=None, cache=None):
    """Logits of every token of ids[past:], with ids[:past] already in `cache` under the same page table."""
    cache = cache or Cache(model, max_seq_len=16 * 8, page_size=8)
    table = table or list(range(-(-len(ids) // 8)))
    batch = Batch.build(cache, [table], [past], [len(ids) - past], logits="all")
    new = torch.tensor(ids[past:])
    inputs = splice_inputs(model, new, [(0, len(new), embeddings)])
    if positions is None:
        positions = model.mrope_positions(ids, past, len(ids) - past, embeddings)
    return model(inputs, positions, replace(batch, token_ids=new)), cache


# --- structure and the image side ---------------------------------------------------------------------------


def test_structure(ours, hf, kind):
    expected = Qwen2_5_VLForConditionalGeneration if kind == "qwen2_5_vl" else Qwen2VLForConditionalGeneration
    assert type(ours) is expected
    assert (ours.image_token_id, ours.vision_start_token_id, ours.vision_end_token_id) == (
        hf.config.image_token_id,
        hf.config.vision_start_token_id,
        hf.config.vision_end_token_id,
    )
    assert vision_of(ours) is ours.vision is ours.vision_model
    assert ours.vision.image_placeholder == "<|vision_start|><|image_pad|><|vision_end|>"
    assert ours.vision_config.window_size == (16 if kind == "qwen2_5_vl" else None)


def test_image_features_match(ours, hf):
    # A 3x5-block image cuts 2x2 windows at its edges; 1x1 and 4x2 ones are a single and two whole windows.
    grids = [(1, 6, 10), (1, 2, 2), (1, 8, 4), (1, 4, 14)]
    num_patches = sum(t * h * w for t, h, w in grids)
    patches = torch.randn(num_patches, 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = torch.cat(hf.get_image_features(patches, torch.tensor(grids)).pooler_output)
    got = ours.encode_images(patches, grids)
    assert got.shape == (num_patches // 4, 64)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    # One image alone gives the same rows as in the batch: attention never crosses images.
    torch.testing.assert_close(ours.encode_images(patches[:60], grids[:1]), got[:15], atol=1e-5, rtol=1e-5)


def test_get_image_embeddings_rows_and_grid(ours, hf, processor):
    emb = ours.vision.get_image_embeddings(model=ours, tokenizer=None, image=TALL, text_alias="<pic>")
    reference = processor.image_processor(images=[TALL], return_tensors="pt")
    assert isinstance(emb, Qwen2VLImageEmbedding)
    assert emb.grid_thw == tuple(reference["image_grid_thw"][0].tolist()) == (1, 16, 6)
    assert emb.num_tokens == 24 and emb.prompt_text == "<|vision_start|><pic><|vision_end|>"
    with torch.no_grad():
        features = hf.get_image_features(reference["pixel_values"], reference["image_grid_thw"]).pooler_output[0]
    torch.testing.assert_close(emb.embeddings, features, atol=1e-5, rtol=1e-5)
    assert ours.vision.get_image_embeddings(image=TALL.copy()).first_id == emb.first_id
    assert ours.vision.get_image_embeddings(image=RED).first_id != emb.first_id


def test_a_processor_cutting_other_patches_is_refused(ours):
    with pytest.raises(ValueError, match=r"cuts .* = \(14, 2, 2\) but the vision model takes \(4, 2, 2\)"):
        ours.vision.processor = Qwen2VLImageProcessor.from_dict({})  # the class defaults: 14-pixel patches


def test_the_grid_is_part_of_the_image_ids():
    # Same picture, same number of rows, different grids: the positions after it differ, so must the ids.
    rows = torch.zeros(6, 8)
    a = Qwen2VLImageEmbedding(rows, image_hash="ab" * 16, grid_thw=(1, 4, 6))
    b = Qwen2VLImageEmbedding(rows, image_hash="ab" * 16, grid_thw=(1, 6, 4))
    assert a.first_id != b.first_id and a.text_alias == b.text_alias


# --- M-RoPE positions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("images", [[], [RED], [TALL, WIDE]], ids=["no-image", "one", "two"])
def test_positions_match_get_rope_index_whole_and_in_chunks(ours, hf, processor, images):
    embeddings = [ours.vision.get_image_embeddings(image=img) for img in images]
    ids = chat_ids(ours, message("Compare them.", len(images)), embeddings)
    expected = reference_positions(hf, reference_inputs(ours, processor, ids, images))
    assert torch.equal(ours.mrope_positions(ids, 0, len(ids), embeddings), expected)
    # Any chunk of the prompt, cut anywhere (inside images too), sees the positions of the whole.
    for start in range(0, len(ids), 5):
        for length in (1, 7, 19):
            length = min(length, len(ids) - start)
            got = ours.mrope_positions(ids, start, length, embeddings)
            assert torch.equal(got, expected[:, start : start + length]), (start, length)
    if images:  # text after an image advances by max(rows, cols) of its merged grid, not by its token count
        assert expected[0, -1] < len(ids) - 1


def test_decode_positions_match_transformers_generate(ours, hf, processor):
    images = [RED, WIDE]
    embeddings = [ours.vision.get_image_embeddings(image=img) for img in images]
    ids = chat_ids(ours, message("Compare them.", 2), embeddings)
    inputs = reference_inputs(ours, processor, ids, images)
    _, deltas = hf.model.get_rope_index(
        inputs["input_ids"], inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"]
    )
    generated = [5, 9, 11]
    tokens = ids + generated
    for i in range(len(ids), len(tokens)):  # transformers' decode positions: the index plus the prompt's delta
        assert ours.mrope_positions(tokens, i, 1, embeddings).tolist() == [[i + int(deltas)]] * 3


def test_positions_need_the_grid():
    model_like = Qwen2VLForConditionalGeneration.mrope_positions
    plain = MMEmbedding(torch.zeros(4, 8), image_hash="cd" * 16)

    class Merge2:
        spatial_merge_size = 2

    ids = [1, *plain.get_ids()[0].tolist(), 2]
    with pytest.raises(ValueError, match="has no grid_thw"):
        model_like(Merge2(), ids, 0, len(ids), [plain])
    wrong = Qwen2VLImageEmbedding(torch.zeros(4, 8), image_hash="cd" * 16, grid_thw=(1, 4, 6))
    ids = [1, *wrong.get_ids()[0].tolist(), 2]
    with pytest.raises(ValueError, match=r"grid \(1, 4, 6\), which does not give its 4 rows"):
        model_like(Merge2(), ids, 0, len(ids), [wrong])


# --- the chat template ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_images", [0, 1, 2])
def test_chat_prompt_tokens_match_the_processor(ours, processor, num_images):
    images = [RED, TALL][:num_images]
    embeddings = [ours.vision.get_image_embeddings(image=img) for img in images]
    messages = message("What is in the image?", num_images)
    ids = chat_ids(ours, messages, embeddings)
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = processor(text=text, images=images or None)["input_ids"][0]
    assert [ours.image_token_id if is_mm_id(t) else t for t in ids] == list(expected)
    assert sum(map(is_mm_id, ids)) == sum(e.num_tokens for e in embeddings)


# --- logits against transformers ------------------------------------------------------------------------------


@pytest.mark.parametrize("images", [[], [RED], [TALL, WIDE]], ids=["no-image", "one", "two"])
def test_prompt_logits_match(ours, hf, processor, images):
    embeddings = [ours.vision.get_image_embeddings(image=img) for img in images]
    ids = chat_ids(ours, message("Compare them.", len(images)), embeddings)
    with torch.no_grad():
        ref = hf(**reference_inputs(ours, processor, ids, images)).logits[0]
    got, _ = forward(ours, ids, embeddings)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    if images:  # positions matter: plain 1-D positions give other logits after the first image
        plain, _ = forward(ours, ids, embeddings, positions=torch.arange(len(ids)))
        assert (plain[-1] - ref[-1]).abs().max() > 1e-2


def test_chunks_cut_inside_an_image_match_one_pass(ours):
    embeddings = [ours.vision.get_image_embeddings(image=img) for img in (RED, TALL)]
    ids = chat_ids(ours, message("Compare them.", 2), embeddings)
    one_pass, _ = forward(ours, ids, embeddings)
    first_image = next(i for i, t in enumerate(ids) if is_mm_id(t))
    cut = first_image + 7  # inside the first image
    cache = Cache(ours, max_seq_len=16 * 8, page_size=8)
    table = [3, 0, 7, 1, 9, 2, 11, 4, 12, 5, 13][: -(-len(ids) // 8)]
    head, _ = forward(ours, ids[:cut], embeddings, table=table, cache=cache)
    tail, _ = forward(ours, ids, embeddings, past=cut, table=table, cache=cache)
    torch.testing.assert_close(torch.cat([head, tail]), one_pass, atol=1e-5, rtol=1e-5)


# --- the generator -------------------------------------------------------------------------------------------


def make_gen(model, pages=64, page_size=8, max_chunk_size=None):
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


def image_job(model, images, question: str, ident, max_new_tokens: int = 32) -> DynamicJob:
    embeddings = [model.vision.get_image_embeddings(model=model, tokenizer=model.tokenizer, image=i) for i in images]
    ids = chat_ids(model, message(question, len(images)), embeddings)
    return DynamicJob(
        torch.tensor([ids]),
        max_new_tokens,
        gen_settings=SamplerSettings.greedy(),
        return_logits=True,
        identifier=ident,
        embeddings=embeddings,
    )


def reference_generate(model, hf, processor, job, images, steps: int = 32) -> tuple[list[int], torch.Tensor]:
    inputs = reference_inputs(model, processor, job.prompt_ids, images)
    with torch.no_grad():
        first_logits = hf(**inputs).logits[0, -1]
        out = hf.generate(**inputs, max_new_tokens=steps, do_sample=False, eos_token_id=None)
    return out[0, len(job.prompt_ids) :].tolist(), first_logits


def first_logits(results) -> torch.Tensor:
    return next(r["logits"][0, 0] for r in results if r.get("logits") is not None and r["logits"].shape[1])


@pytest.mark.parametrize("images, chunk", [([RED], 6), ([TALL, WIDE], 10)], ids=["one-image", "two-images"])
def test_generator_greedy_matches_transformers(ours, hf, processor, images, chunk):
    job = image_job(ours, images, "Compare them.", "a")
    results = run(make_gen(ours, max_chunk_size=chunk), [job])["a"]
    ref_tokens, ref_logits = reference_generate(ours, hf, processor, job, images)
    assert tokens(results) == ref_tokens
    torch.testing.assert_close(first_logits(results), ref_logits, atol=1e-4, rtol=1e-4)


def test_same_image_in_two_concurrent_jobs_is_computed_once(ours):
    questions = {"first": "What is in the image?", "second": "Describe this picture."}
    solo = {name: run(make_gen(ours), [image_job(ours, [RED], q, name, 8)])[name] for name, q in questions.items()}
    jobs = [image_job(ours, [RED.copy()], q, name, 8) for name, q in questions.items()]
    image_end = max(i for i, t in enumerate(jobs[1].prompt_ids) if is_mm_id(t)) + 1

    both = run(make_gen(ours), jobs)
    assert both["first"][-1]["cached_tokens"] == 0
    assert both["second"][-1]["cached_tokens"] >= image_end  # the text before and the whole image reused
    for name in questions:
        assert tokens(both[name]) == tokens(solo[name]), name
        torch.testing.assert_close(both[name][-1]["logits"], solo[name][-1]["logits"], atol=1e-5, rtol=1e-5)


def test_later_job_reuses_cached_image_pages_with_right_positions(ours, hf, processor):
    # The second job's prefill starts after the cached prefix (past the images), its first chunk holds no image,
    # yet its positions must continue after both images' grids.
    images = [TALL, WIDE]
    gen = make_gen(ours, max_chunk_size=4)
    run(gen, [image_job(ours, images, "Compare them.", "first", 4)])
    later = image_job(ours, images, "Compare them, tell me which one is bigger.", "later")
    results = run(gen, [later])["later"]
    image_end = max(i for i, t in enumerate(later.prompt_ids) if is_mm_id(t)) + 1
    assert results[-1]["cached_tokens"] >= image_end - image_end % 8
    ref_tokens, ref_logits = reference_generate(ours, hf, processor, later, images)
    assert tokens(results) == ref_tokens
    torch.testing.assert_close(first_logits(results), ref_logits, atol=1e-4, rtol=1e-4)


def test_text_only_job_on_a_vision_model_matches_transformers(ours, hf, processor):
    job = image_job(ours, [], "Describe this picture.", "text", 12)
    results = run(make_gen(ours, max_chunk_size=5), [job])["text"]
    ref_tokens, ref_logits = reference_generate(ours, hf, processor, job, [], steps=12)
    assert tokens(results) == ref_tokens
    torch.testing.assert_close(first_logits(results), ref_logits, atol=1e-4, rtol=1e-4)


# --- configs -------------------------------------------------------------------------------------------------

# Qwen/Qwen2-VL-2B-Instruct's config.json as released: the text model's keys at the top level, "mrope" rope type.
QWEN2_VL_2B = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 1536,
    "initializer_range": 0.02,
    "intermediate_size": 8960,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen2_vl",
    "num_attention_heads": 12,
    "num_hidden_layers": 28,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {
        "depth": 32,
        "embed_dim": 1280,
        "mlp_ratio": 4,
        "num_heads": 16,
        "in_chans": 3,
        "hidden_size": 1536,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 151936,
}


def test_released_flat_config_takes_the_text_keys_from_the_top_level():
    config = ModelConfig.from_hf_dict(json.loads(json.dumps(QWEN2_VL_2B)))
    ref = transformers.Qwen2VLConfig(**{k: v for k, v in QWEN2_VL_2B.items() if k != "architectures"}).text_config
    fields = (
        "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads "
        "rms_norm_eps max_position_embeddings sliding_window"
    ).split()
    assert {f: getattr(config, f) for f in fields} == {f: getattr(ref, f) for f in fields}
    assert config.rope_theta == ref.rope_parameters["rope_theta"] and config.rope_scaling is None
    assert config.tie_word_embeddings and config.image_token_id == 151655
    assert config.text_architecture == "Qwen2ForCausalLM" and config.head_dim == 128
    with torch.device("meta"):
        model = Qwen2VLForConditionalGeneration(config)
    vc = model.vision_config
    assert (vc.depth, vc.hidden_size, vc.intermediate_size, vc.out_hidden_size) == (32, 1280, 5120, 1536)
    assert model.rope.row_of_dim[:64].tolist() == [0] * 16 + [1] * 24 + [2] * 24


def test_nested_config_with_transformers_defaults(folder, kind):
    config = ModelConfig.from_file(folder / "config.json")
    assert config.text_architecture == "Qwen2ForCausalLM" and config.rope_theta == 100.0
    bare = {"architectures": [config.architecture], "model_type": kind, "text_config": {"model_type": f"{kind}_text"}}
    defaults = ModelConfig.from_hf_dict(bare)
    ref = CLASSES[kind][0](text_config={}).text_config
    assert (defaults.hidden_size, defaults.num_hidden_layers, defaults.rms_norm_eps, defaults.rope_theta) == (
        ref.hidden_size,
        ref.num_hidden_layers,
        ref.rms_norm_eps,
        ref.rope_parameters["rope_theta"],
    )


def _edited(folder, tmp_path, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        section, _, field = key.rpartition(".")
        target = config
        for part in section.split(".") if section else []:
            target = target[part]
        target[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")


@pytest.mark.parametrize(
    "changes, error, message",
    [
        ({"text_config.model_type": "llama"}, UnsupportedArchitectureError, "'LlamaForCausalLM'"),
        ({"text_config.rope_parameters.mrope_section": [2, 3, 4]}, ModelLoadError, r"add up to 8"),
        ({"text_config.rope_parameters.mrope_section": "2,3,3"}, ModelLoadError, "mrope_section must be a list"),
        ({"vision_config.num_heads": 3}, ModelLoadError, "head size divisible by 4"),
        ({"vision_start_token_id": "<|vision_start|>"}, ModelLoadError, "vision_start_token_id"),
    ],
)
def test_bad_configs_are_named(folder, tmp_path, changes, error, message):
    _edited(folder, tmp_path, **changes)
    with pytest.raises(error, match=message):
        Model.load(tmp_path, dtype=torch.float32)


def test_vision_width_mismatch_is_named(folder, tmp_path, kind):
    key = "vision_config.out_hidden_size" if kind == "qwen2_5_vl" else "vision_config.hidden_size"
    _edited(folder, tmp_path, **{key: 48})
    with pytest.raises(ModelLoadError, match="rows of width 48 but the language model's hidden_size is 64"):
        Model.load(tmp_path, dtype=torch.float32)


# --- counting an image's tokens for the context meter --------------------------------------------------------


@pytest.mark.parametrize("size", [(40, 30), (23, 61), (160, 40), (9, 9), (300, 200)])
def test_image_token_count_needs_no_vision_tower(folder, ours, size):
    # A model built without weights and without its vision model counts what the real one embeds: one id per
    # merged block of the picture's own grid (tiny pictures grown to min_pixels, big ones shrunk to max_pixels).
    with torch.device("meta"):
        bare = type(ours)(ModelConfig.from_file(folder / "config.json"))
    bare.source_path, bare.visual = folder, None
    image = picture("red", box=(1, 1, size[0] - 2, size[1] - 2), size=size)
    real = ours.vision.get_image_embeddings(image=image)
    assert bare.vision.count_image_tokens(image) == real.num_tokens
    # The stand-in has the real one's grid and <|vision_start|> / <|vision_end|>: the chat has the same length.
    stand_in = bare.vision.stand_in(image)
    assert stand_in.grid_thw == real.grid_thw
    assert len(chat_ids(ours, message("hi", 1), [stand_in])) == len(chat_ids(ours, message("hi", 1), [real]))


def test_image_token_count_follows_the_exif_orientation(ours, tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 60 x 20, shown (and embedded) 20 x 60
    picture("red", box=(2, 2, 50, 15), size=(60, 20)).save(tmp_path / "photo.jpg", exif=exif)
    real = ours.vision.get_image_embeddings(image=tmp_path / "photo.jpg")
    assert real.grid_thw[1] > real.grid_thw[2]
    assert ours.vision.count_image_tokens(tmp_path / "photo.jpg") == real.num_tokens
    assert ours.vision.stand_in(tmp_path / "photo.jpg").grid_thw == real.grid_thw


def test_stand_ins_of_two_pictures_count_a_chat_with_both(ours):
    # Sizes that differ in their last digits: each stand-in keeps its own alias, so each counts at its own length.
    images = [picture("red", size=(1200, 904)), picture("blue", size=(1200, 90))]
    real = [ours.vision.get_image_embeddings(image=image) for image in images]
    stand_ins = [ours.vision.stand_in(image) for image in images]
    assert stand_ins[0].text_alias != stand_ins[1].text_alias
    assert len(chat_ids(ours, message("hi", 2), stand_ins)) == len(chat_ids(ours, message("hi", 2), real))
