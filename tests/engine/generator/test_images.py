"""Jobs with image embeddings: validation, splicing rows into the forward, and prefix reuse across jobs."""

from __future__ import annotations

import pytest
import torch
import transformers
from PIL import Image, ImageDraw

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Model
from engine.vision.embedding import MMEmbedding


def picture(colour: str, box=(4, 4, 24, 24)) -> Image.Image:
    img = Image.new("RGB", (40, 32), "white")
    ImageDraw.Draw(img).ellipse(box, fill=colour)
    return img


def fake_embedding(n=4, hidden=64, tag="a") -> MMEmbedding:
    return MMEmbedding(torch.randn(n, hidden), image_hash=tag * 32)


# --- validation (no model needed) --------------------------------------------------------------------------


def test_job_rejects_image_ids_without_their_embedding():
    e = fake_embedding()
    ids = [5, 6, *e.get_ids()[0].tolist(), 7]
    with pytest.raises(ValueError, match="no embedding in embeddings"):
        DynamicJob(torch.tensor([ids]), 4)


def test_job_rejects_an_embedding_whose_alias_is_not_in_the_prompt():
    with pytest.raises(ValueError, match="not in input_ids"):
        DynamicJob(torch.tensor([[5, 6, 7]]), 4, embeddings=[fake_embedding()])


def test_job_rejects_a_cut_image_run():
    e = fake_embedding(n=6)
    ids = [5, *e.get_ids()[0].tolist()[:3], 7]
    with pytest.raises(ValueError, match="not in input_ids"):
        DynamicJob(torch.tensor([ids]), 4, embeddings=[e])


def test_job_rejects_something_that_is_not_an_embedding():
    with pytest.raises(ValueError, match="not an MMEmbedding"):
        DynamicJob(torch.tensor([[5, 6]]), 4, embeddings=[torch.zeros(3, 4)])


def test_embedding_ids_depend_on_content_and_stay_outside_the_vocabulary():
    a, b = fake_embedding(tag="a"), fake_embedding(tag="b")
    assert a.first_id != b.first_id and a.first_id >= 1 << 40
    assert fake_embedding(tag="a").first_id == a.first_id
    assert a.last_id - a.first_id + 1 == 4


def test_text_only_model_refuses_image_jobs(tiny_model):
    gen = DynamicGenerator(tiny_model, Cache(tiny_model, max_seq_len=256, page_size=16), tiny_model.tokenizer)
    e = fake_embedding(hidden=tiny_model.config.hidden_size)
    job = DynamicJob(torch.tensor([[5, *e.get_ids()[0].tolist()]]), 4, embeddings=[e])
    with pytest.raises(ValueError, match="text-only"):
        gen.enqueue(job)


# --- a real LLaVA ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llava(tiny_llava_folder):
    return Model.load(tiny_llava_folder, dtype=torch.float32)


@pytest.fixture(scope="module")
def llava_hf(tiny_llava_folder):
    return transformers.LlavaForConditionalGeneration.from_pretrained(tiny_llava_folder, dtype=torch.float32).eval()


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


def test_image_job_matches_transformers_greedy(llava, llava_hf, tiny_llava_folder):
    img = picture("red")
    emb = llava.vision.get_image_embeddings(model=llava, tokenizer=llava.tokenizer, image=img)
    ids = llava.tokenizer.encode(f"look {emb.text_alias} now tell", embeddings=[emb])
    job = DynamicJob(ids, 24, gen_settings=SamplerSettings.greedy(), identifier="a", embeddings=[emb])
    ours = tokens(run(make_gen(llava), [job])["a"])

    processor = transformers.SiglipImageProcessorPil.from_pretrained(tiny_llava_folder)
    pixels = processor(images=[img], return_tensors="pt")["pixel_values"]
    hf_ids = [t if t < emb.first_id else llava_hf.config.image_token_index for t in ids[0].tolist()]
    with torch.no_grad():
        out = llava_hf.generate(
            input_ids=torch.tensor([hf_ids]),
            pixel_values=pixels,
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert ours == out[0, len(hf_ids) :].tolist()


def test_same_image_in_a_later_job_reuses_its_pages(llava):
    red, blue = picture("red"), picture("blue", box=(10, 2, 30, 22))
    vision, tok = llava.vision, llava.tokenizer
    e_red = vision.get_image_embeddings(model=llava, tokenizer=tok, image=red)
    e_red_again = vision.get_image_embeddings(model=llava, tokenizer=tok, image=red.copy())
    e_blue = vision.get_image_embeddings(model=llava, tokenizer=tok, image=blue)
    assert e_red.first_id == e_red_again.first_id and e_red.first_id != e_blue.first_id

    def job(e, question, ident):
        ids = tok.encode(f"the picture {e.text_alias} {question}", embeddings=[e])
        return DynamicJob(ids, 4, gen_settings=SamplerSettings.greedy(), identifier=ident, embeddings=[e])

    gen = make_gen(llava)
    first = run(gen, [job(e_red, "what is it?", "first")])["first"][-1]
    assert first["cached_tokens"] == 0
    prefix = len(tok.encode("the picture ")[0]) + e_red.num_tokens
    again = run(gen, [job(e_red_again, "which colour?", "again")])["again"][-1]
    assert again["cached_tokens"] >= prefix  # the whole image run came from the cache
    other = run(gen, [job(e_blue, "what is it?", "other")])["other"][-1]
    assert other["cached_tokens"] < prefix - e_red.num_tokens + 1  # a different image shares only the text


def test_two_images_in_one_prompt_and_concurrent_jobs_agree_with_solo_runs(llava):
    vision, tok = llava.vision, llava.tokenizer
    e1 = vision.get_image_embeddings(model=llava, tokenizer=tok, image=picture("green"))
    e2 = vision.get_image_embeddings(model=llava, tokenizer=tok, image=picture("purple", box=(12, 6, 30, 28)))

    def job(ident):
        ids = tok.encode(f"one {e1.text_alias} two {e2.text_alias} compare", embeddings=[e1, e2])
        return DynamicJob(ids, 12, gen_settings=SamplerSettings.greedy(), identifier=ident, embeddings=[e1, e2])

    solo = tokens(run(make_gen(llava), [job("solo")])["solo"])
    text_job = DynamicJob(tok.encode("just text here"), 12, gen_settings=SamplerSettings.greedy(), identifier="t")
    both = run(make_gen(llava), [job("x"), text_job, job("y")])
    assert tokens(both["x"]) == solo and tokens(both["y"]) == solo
    # Swapping the two images changes the answer's inputs, so the logits differ.
    swapped = tok.encode(f"one {e2.text_alias} two {e1.text_alias} compare", embeddings=[e1, e2])
    gen = make_gen(llava)
    r = run(gen, [DynamicJob(swapped, 1, return_logits=True, identifier="s", embeddings=[e1, e2])])["s"]
    r2 = run(
        make_gen(llava), [DynamicJob(job("z").prompt_ids, 1, return_logits=True, identifier="z", embeddings=[e1, e2])]
    )
    assert not torch.allclose(r[-1]["logits"], r2["z"][-1]["logits"])
