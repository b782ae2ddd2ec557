"""EngineService with a vision model (the tiny random LLaVA): image embeddings off the GUI thread and cached,
prompts holding image runs, jobs that see the image, and a catalogue that knows which folders take images.

Bad inputs tried: a truncated PNG, a text file named .png, a path that does not exist, image parts with no
embeddings, embeddings for a text-only model, a user typing the "<image>" placeholder.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import threading
from pathlib import Path

import pytest
import torch
from PIL import Image

import engine.vision.image
from app.service import EngineService, describe_model
from app.service.catalog import DEMO_VISION_NAME, demo_vision_path
from engine.errors import ImageError
from engine.vision.embedding import is_mm_id
from engine.vision.prompt import user_message

TIMEOUT = 60
GREEDY = {"temperature": 1.0, "top_k": 1, "token_repetition_penalty": 1.0}
QUESTION = "Describe this image."


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT))


def png(color: tuple[int, int, int], size: int = 40) -> bytes:
    out = io.BytesIO()
    image = Image.new("RGB", (size, size), (128, 128, 128))
    image.paste(color, (size // 4, size // 4, 3 * size // 4, 3 * size // 4))
    image.save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def images(tmp_path):
    paths = {}
    for name, color in {"red": (220, 40, 40), "blue": (40, 80, 225)}.items():
        paths[name] = tmp_path / f"{name}.png"
        paths[name].write_bytes(png(color))
    paths["red copy"] = tmp_path / "red-copy.png"  # same bytes, another name: one embedding
    paths["red copy"].write_bytes(png((220, 40, 40)))
    return paths


@pytest.fixture
def vision_service(loop, tiny_llava_folder):
    svc = EngineService(dtype=torch.float32, page_size=16, max_cache_tokens=2048)
    svc.load_model(tiny_llava_folder, "tiny-llava")
    assert run(loop, svc.wait_loaded())
    yield svc
    run(loop, svc.close())


class ThreadRecorder:
    """Wraps the model's real get_image_embeddings to note which thread each call ran on."""

    def __init__(self, vision):
        self.real = vision.get_image_embeddings
        self.threads: list[threading.Thread] = []

    def __call__(self, **kwargs):
        self.threads.append(threading.current_thread())
        return self.real(**kwargs)


def test_embeddings_run_off_the_gui_thread_and_are_cached(loop, vision_service, images, monkeypatch):
    svc = vision_service
    assert svc.can_see_images and svc.image_placeholder == "<image>"
    recorder = ThreadRecorder(svc.model.vision)
    monkeypatch.setattr(svc.model.vision, "get_image_embeddings", recorder)
    gui = threading.current_thread()

    first = run(loop, svc.embed_images([images["red"], images["blue"]]))
    assert [e.num_tokens for e in first] == [svc.model.tokens_per_image] * 2 == [16, 16]
    assert first[0].first_id != first[1].first_id  # two pictures, two id runs
    assert len(recorder.threads) == 2 and all(t is not gui for t in recorder.threads)
    assert all(t.name.startswith("tandem-vision") for t in recorder.threads)

    # Resending the chat: same files, another file with the same bytes, and raw bytes — no new encodes.
    again = run(loop, svc.embed_images([images["red"], images["blue"], images["red copy"]]))
    assert again[0] is first[0] and again[1] is first[1] and again[2] is first[0]
    assert run(loop, svc.embed_images([images["blue"].read_bytes()]))[0] is first[1]
    assert len(recorder.threads) == 2 and svc.num_cached_images == 2

    # The rows are the model's own: what model.encode_images gives for the preprocessed picture.
    pixels = svc.model.vision.processor(Image.open(images["red"]).convert("RGB"))
    expected = svc.model.encode_images(pixels.unsqueeze(0))[0]
    torch.testing.assert_close(first[0].embeddings, expected)


def test_each_image_file_is_read_once_and_hashed_once(loop, vision_service, images, monkeypatch):
    # The service reads the file and hashes its bytes; the engine decodes those bytes and takes that digest
    # for the ids, rather than reading the path again and hashing the pixels.
    red = images["red"].read_bytes()
    reads, digests, pixel_hashes = [], [], []
    real_read, real_sha256, real_pixels = Path.read_bytes, hashlib.sha256, engine.vision.image.image_content_hash
    monkeypatch.setattr(Path, "read_bytes", lambda path: reads.append(path) or real_read(path))
    monkeypatch.setattr(hashlib, "sha256", lambda data=b"", **kw: digests.append(data) or real_sha256(data, **kw))
    monkeypatch.setattr(engine.vision.image, "image_content_hash", lambda p: pixel_hashes.append(p) or real_pixels(p))

    (embedding,) = run(loop, vision_service.embed_images([images["red"]]))
    assert reads.count(images["red"]) == 1 and digests.count(red) == 1 and pixel_hashes == []
    assert embedding.image_hash == real_sha256(red).hexdigest()


def test_gui_keeps_running_while_an_image_is_embedded(loop, vision_service, images):
    ticks = []

    async def ticker():
        while True:
            ticks.append(loop.time())
            await asyncio.sleep(0)

    async def go():
        task = asyncio.ensure_future(ticker())
        await vision_service.embed_images([images["red"], images["blue"]])
        task.cancel()

    run(loop, go())
    assert len(ticks) >= 2  # the loop ran other work while the vision tower did


def test_encode_chat_places_each_image_run_in_its_message(loop, vision_service, images):
    svc = vision_service
    red, blue = run(loop, svc.embed_images([images["red"], images["blue"]]))
    messages = [
        user_message(QUESTION, 1),
        {"role": "assistant", "content": "A red square."},
        user_message("And this one?", 1),
    ]
    ids = svc.encode_chat(messages, "Be brief.", images=[red, blue])[0].tolist()
    assert ids[ids.index(red.first_id) : ids.index(red.first_id) + 16] == list(range(red.first_id, red.last_id + 1))
    assert ids[ids.index(blue.first_id) : ids.index(blue.first_id) + 16] == list(range(blue.first_id, blue.last_id + 1))
    assert ids.index(red.last_id) < ids.index(blue.first_id)
    assert sum(map(is_mm_id, ids)) == 32
    text = svc.tokenizer.decode(ids, decode_special_tokens=True)  # image ids are left out of the text
    assert text.index("Be brief.") < text.index(QUESTION) < text.index("A red square.") < text.index("And this one?")
    # Text-only conversations encode exactly as before.
    plain = [{"role": "user", "content": QUESTION}]
    assert svc.encode_chat(plain).tolist() == svc.encode_chat(plain, images=[]).tolist()
    # The meter counts image tokens without running the vision tower.
    assert svc.count_tokens(messages, "Be brief.") == len(ids)
    assert svc.count_tokens(messages, "Be brief.", images=[red, blue]) == len(ids)
    # (+16 image ids, and the newline the template puts after an image)
    assert svc.count_tokens([user_message(QUESTION, 1)]) - svc.count_tokens(plain) in (16, 17)


def test_prompts_and_images_must_agree(loop, vision_service, images):
    svc = vision_service
    (red,) = run(loop, svc.embed_images([images["red"]]))
    with pytest.raises(ValueError, match="1 image parts but 0"):
        svc.encode_chat([user_message(QUESTION, 1)], images=[])
    with pytest.raises(ValueError, match="0 image parts but 1"):
        svc.encode_chat([{"role": "user", "content": QUESTION}], images=[red])
    with pytest.raises(ValueError, match="placeholder"):  # typed text cannot claim an image slot
        svc.encode_chat([user_message("What is <image>?", 1)], images=[red])


def test_job_sees_the_image_and_the_next_turn_reuses_its_pages(loop, vision_service, images):
    svc = vision_service
    red, blue = run(loop, svc.embed_images([images["red"], images["blue"]]))

    async def answer(messages, embeddings):
        ids = svc.encode_chat(messages, images=embeddings)
        job = svc.start_job(ids, GREEDY, max_new_tokens=8, seed=0, embeddings=embeddings)
        results = [r async for r in job]
        return ids, results[-1]

    ids_red, eos_red = run(loop, answer([user_message(QUESTION, 1)], [red]))
    _, eos_blue = run(loop, answer([user_message(QUESTION, 1)], [blue]))
    assert eos_red["eos"] and eos_red["prompt_tokens"] == ids_red.shape[-1]
    # Random weights, but the image rows reach the logits: two pictures, two answers.
    assert eos_red["full_completion"] != eos_blue["full_completion"]

    follow_up = [
        user_message(QUESTION, 1),
        {"role": "assistant", "content": eos_red["full_completion"]},
        {"role": "user", "content": "How many shapes are there?"},
    ]
    _, eos = run(loop, answer(follow_up, [red]))
    image_end = ids_red[0].tolist().index(red.last_id) + 1
    assert eos["cached_tokens"] >= image_end  # the turn's prefix, image included, came from the cache


def test_bad_images_raise_image_errors_naming_the_file(loop, vision_service, images, tmp_path):
    svc = vision_service
    half = tmp_path / "half.png"
    half.write_bytes(images["red"].read_bytes()[:60])
    notes = tmp_path / "notes.png"
    notes.write_text("this is not a picture")
    for path in (half, notes, tmp_path / "gone.png"):
        with pytest.raises(ImageError) as info:
            run(loop, svc.embed_images([images["red"], path]))
        assert path.name in str(info.value)
    # The service is still fine: the good image embeds (from the cache) and nothing bad was kept.
    assert len(run(loop, svc.embed_images([images["red"]]))) == 1
    assert svc.num_cached_images == 1


def test_a_text_only_model_cannot_see_images(loop, tiny_folder, images):
    svc = EngineService(dtype=torch.float32)
    svc.load_model(tiny_folder, "tiny")
    assert run(loop, svc.wait_loaded())
    try:
        assert svc.can_see_images is False
        with pytest.raises(ValueError, match="cannot see images.*demo vision model"):
            run(loop, svc.embed_images([images["red"]]))
        with pytest.raises(ValueError, match="cannot see images"):
            svc.encode_chat([user_message(QUESTION, 1)])
        assert svc.count_tokens([{"role": "user", "content": QUESTION}]) > 0  # text as before
    finally:
        run(loop, svc.close())


# --- catalogue -------------------------------------------------------------------------------------------


def test_describe_a_llava_folder_from_its_config(tiny_llava_folder, tiny_folder):
    info = describe_model(tiny_llava_folder)
    assert info["architecture"] == "LlavaForConditionalGeneration" and info["supported"] is True
    assert info["can_see_images"] is True
    assert info["context_length"] == 1024  # from text_config
    assert describe_model(tiny_folder)["can_see_images"] is False


def test_describe_reads_no_weights(tiny_llava_folder, tmp_path):
    # A config alone (weights missing) is enough to tell what the folder is.
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_llava_folder / "config.json").read_text())
    info = describe_model(folder)
    assert info["can_see_images"] is True and info["size_bytes"] == 0
    config = json.loads((tiny_llava_folder / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    assert describe_model(folder)["can_see_images"] is False
    for arch in ("Gemma3ForConditionalGeneration", "SmolVLMForConditionalGeneration"):  # every engine VLM counts
        config["architectures"] = [arch]
        (folder / "config.json").write_text(json.dumps(config))
        assert describe_model(folder)["can_see_images"] is True, arch


def test_demo_vision_path_is_in_the_repository_assets():
    path = demo_vision_path()
    assert path.parts[-2:] == ("assets", "demo-vision")
    assert (path.parent / "presets.json").is_file()  # the same assets folder as the app's other files
    assert DEMO_VISION_NAME == "Demo vision model"
