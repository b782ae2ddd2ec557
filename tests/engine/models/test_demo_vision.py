"""The bundled demo vision model: our engine and transformers give the same greedy answers, and they are right."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers

from engine.cache import Cache
from engine.chat_template import ChatTemplate
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Model
from engine.vision.prompt import render_with_images, user_message

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "assets" / "demo-vision"
sys.path.insert(0, str(ROOT / "tools" / "demo_vision"))
shapes = pytest.importorskip("shapes")

SCENES = [
    [("red", "circle"), ("blue", "square")],
    [("green", "triangle")],
    [("yellow", "star"), ("purple", "diamond"), ("orange", "circle")],
]


@pytest.fixture(scope="module")
def ours():
    return Model.load(DEMO, dtype=torch.float32)


@pytest.fixture(scope="module")
def theirs():
    return transformers.LlavaForConditionalGeneration.from_pretrained(DEMO, dtype=torch.float32).eval()


def our_answer(model, image, question):
    tok = model.tokenizer
    emb = model.vision.get_image_embeddings(model=model, tokenizer=tok, image=image)
    text = render_with_images(ChatTemplate.from_tokenizer(tok), [user_message(question, 1)], [emb])
    ids = tok.encode(text, encode_special_tokens=True, embeddings=[emb])
    gen = DynamicGenerator(model, Cache(model, max_seq_len=512, page_size=64), tok)
    job = DynamicJob(
        ids, 40, gen_settings=SamplerSettings.greedy(), embeddings=[emb], stop_conditions=[tok.eos_token_id]
    )
    gen.enqueue(job)
    out = []
    while gen.num_remaining_jobs():
        out += [r for r in gen.iterate() if r["eos"]]
    return ids, emb, out[-1]


@pytest.mark.parametrize("objects", SCENES, ids=lambda o: "+".join(f"{c}-{s}" for c, s in o))
def test_engine_and_transformers_agree_and_describe_correctly(ours, theirs, objects):
    image = shapes.render_objects(objects, seed=3)
    ids, emb, result = our_answer(ours, image, "Describe this image.")
    answer = result["full_completion"].lower()
    for colour, shape in objects:
        assert f"{colour} {shape}" in answer, answer

    processor = transformers.SiglipImageProcessorPil.from_pretrained(DEMO)
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    hf_ids = [t if t < emb.first_id else theirs.config.image_token_index for t in ids[0].tolist()]
    with torch.no_grad():
        out = theirs.generate(input_ids=torch.tensor([hf_ids]), pixel_values=pixels, max_new_tokens=40, do_sample=False)
    hf_tokens = out[0, len(hf_ids) :].tolist()
    eos = ours.tokenizer.eos_token_id
    hf_tokens = hf_tokens[: hf_tokens.index(eos) + 1] if eos in hf_tokens else hf_tokens
    assert result["full_completion"] == ours.tokenizer.decode(hf_tokens)
    assert result["new_tokens"] == len(hf_tokens)


def test_colour_and_count_questions(ours):
    image = shapes.render_objects([("red", "circle"), ("blue", "square")], seed=5)
    assert "blue" in our_answer(ours, image, "What colour is the square?")[2]["full_completion"].lower()
    assert "two" in our_answer(ours, image, "How many shapes are there?")[2]["full_completion"].lower()
