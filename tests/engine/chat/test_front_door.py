"""engine.chat.door.ChatFrontDoor: a chat (images included) becomes the same prompt ids as encode_chat gives, the
context check refuses or shortens as asked, the reasoning format reaches the job, and the server's requests go
through the same door (sharing its image embeddings).

Bad inputs tried: a prompt that fills the context, an answer asking for more than the room left, image parts for
a text-only model, the same picture sent twice (and by two callers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import io

import pytest
import torch
from PIL import Image

from engine import Cache, Model, SamplerSettings
from engine.chat.door import ChatFrontDoor
from engine.chat.errors import ContextOverflow, NoVisionError
from engine.chat.prompt import encode_chat
from engine.chat.request import AnswerOptions, ChatRequest
from engine.chat_template import ChatTemplate
from engine.generator.dynamic_async import DynamicGeneratorAsync
from engine.generator.filters import RegexFilter
from engine.server.messages import ChatInput
from engine.server.served import ServedModel
from engine.vision.embedding import is_mm_id
from engine.vision.handle import vision_of
from engine.vision.prompt import user_message

QUESTION = "Describe this image."
CHAT = [{"role": "user", "content": "The quick brown fox"}]


def png(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 40), color).save(out, "PNG")
    return out.getvalue()


def door_of(model: Model, context_length: int = 256) -> ChatFrontDoor:
    template = ChatTemplate.from_tokenizer(model.tokenizer)
    return ChatFrontDoor(model, model.tokenizer, template, context_length=context_length, vision=vision_of(model))


async def collect(job) -> list[dict]:
    return [result async for result in job]


def answer_with(model: Model, door: ChatFrontDoor, ids, answer: AnswerOptions, max_new_tokens: int) -> list[dict]:
    async def go():
        generator = DynamicGeneratorAsync(model, Cache(model, max_seq_len=256, page_size=16), model.tokenizer)
        try:
            return await collect(door.start_job(generator, ids, answer, max_new_tokens=max_new_tokens))
        finally:
            await generator.close()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def llava(tiny_llava_folder):
    return Model.load(tiny_llava_folder, dtype=torch.float32)


class TowerCalls:
    """Counts calls of the model's real get_image_embeddings."""

    def __init__(self, vision):
        self.real, self.calls = vision.get_image_embeddings, 0

    def __call__(self, **kwargs):
        self.calls += 1
        return self.real(**kwargs)


def test_a_chat_with_an_image_gives_encode_chats_ids_and_embeds_each_picture_once(llava, monkeypatch):
    door = door_of(llava)
    tower = TowerCalls(door.vision)
    monkeypatch.setattr(door.vision, "get_image_embeddings", tower)
    red = door.embed_image(png((220, 40, 40)))
    assert door.embed_image(png((220, 40, 40))) is red and tower.calls == 1 and len(door.images) == 1

    messages = [user_message(QUESTION, 1), {"role": "assistant", "content": "A red square."}]
    ids = door.prompt_ids(ChatRequest([*messages, user_message("And again?", 1)], "Be brief.", images=[red, red]))
    system = {"role": "system", "content": "Be brief."}
    expected = encode_chat(
        llava.tokenizer, door.template, [system, *messages, user_message("And again?", 1)], [red, red], "<image>"
    )
    assert ids.tolist() == expected.tolist()
    assert sum(map(is_mm_id, ids[0].tolist())) == 2 * red.num_tokens  # one run per image part
    text = llava.tokenizer.decode(ids[0].tolist(), decode_special_tokens=True)
    assert text.index("Be brief.") < text.index(QUESTION) < text.index("And again?")
    # The meter's stand-ins count the same ids without the tower.
    stand_ins = door.stand_ins(2)
    counted = door.prompt_ids(ChatRequest([*messages, user_message("And again?", 1)], "Be brief.", images=stand_ins))
    assert counted.shape == ids.shape and tower.calls == 1


def test_images_need_a_vision_model_and_agree_with_their_parts(tiny_model, llava):
    text_door = door_of(tiny_model)
    with pytest.raises(NoVisionError, match="cannot see"):
        text_door.prompt_ids(ChatRequest([user_message(QUESTION, 1)]))
    with pytest.raises(NoVisionError, match="no vision tower"):
        text_door.embed_image(png((1, 2, 3)))
    with pytest.raises(ValueError, match="1 image parts but 0"):
        door_of(llava).prompt_ids(ChatRequest([user_message(QUESTION, 1)]))


def test_the_context_check_refuses_or_shortens_as_the_answer_asks(tiny_model):
    door = door_of(tiny_model, context_length=64)
    num_prompt = int(door.prompt_ids(ChatRequest(CHAT)).shape[-1])
    room = 64 - num_prompt
    assert door.fit(num_prompt, AnswerOptions()) == room  # no max_new_tokens: all the room left
    assert door.fit(num_prompt, AnswerOptions(max_new_tokens=room + 50)) == room  # the app: cut to the room
    assert door.fit(num_prompt, AnswerOptions(max_new_tokens=3, shorten_to_fit=False)) == 3
    with pytest.raises(ContextOverflow) as asked_too_much:  # the server: refused, the client asked for that many
        door.fit(num_prompt, AnswerOptions(max_new_tokens=room + 1, shorten_to_fit=False))
    error = asked_too_much.value
    assert (error.num_prompt, error.context_length, error.max_new_tokens) == (num_prompt, 64, room + 1)
    assert f"and {room + 1} new tokens does not fit the context of 64 tokens" in str(error)
    with pytest.raises(ContextOverflow, match="Shorten the conversation"):  # a prompt that fills the context
        door.fit(64, AnswerOptions())
    assert isinstance(error, ValueError)


def test_a_job_stops_at_end_of_turn_and_the_callers_stops_with_json_mode_and_each_image_once(tiny_model, llava):
    door = door_of(tiny_model)
    ids = door.prompt_ids(ChatRequest(CHAT))
    greedy = SamplerSettings.greedy()
    free = answer_with(tiny_model, door, ids, AnswerOptions(settings=greedy), 12)[-1]["full_completion"]
    assert len(free) > 3
    stop = free[2:4]
    stopped = answer_with(tiny_model, door, ids, AnswerOptions(settings=greedy, stop=(stop,)), 12)[-1]
    assert stopped["eos_reason"] == "stop_string" and stopped["full_completion"] == free[: free.index(stop)]

    async def built(model, door, ids, answer, images=()):
        generator = DynamicGeneratorAsync(model, Cache(model, max_seq_len=256, page_size=16), model.tokenizer)
        try:
            job = door.start_job(generator, ids, answer, max_new_tokens=4, images=images)
            await job.cancel()
            return job.job
        finally:
            await generator.close()

    job = asyncio.run(built(tiny_model, door, ids, AnswerOptions(json_mode=True, stop=("\n\n",), seed=7)))
    assert job.stop_tokens >= set(tiny_model.tokenizer.eos_token_ids) and job.stop_strings == ("\n\n",)
    assert job.filter_prefer_eos and len(job.filters) == 1 and job.filters[0].schema == {"type": "object"}
    assert job.seed == 7 and job.reasoning is None
    vision_door = door_of(llava)
    red = vision_door.embed_image(png((220, 40, 40)))
    two = vision_door.prompt_ids(ChatRequest([user_message(QUESTION, 2)], images=[red, red]))
    assert asyncio.run(built(llava, vision_door, two, AnswerOptions(), images=[red, red])).embeddings == [red]


def test_the_reasoning_format_reaches_chat_jobs_only(tmp_path, reasoning_models, tiny_model):
    assert door_of(tiny_model).reasoning is None  # ChatML without tags: no thinking to split
    model = reasoning_models.tiny_qwen3(tmp_path, reasoning_models.QWEN3_STYLE)
    door = door_of(model)
    assert door.reasoning is not None and door.reasoning.start == "<think>" and door.reasoning.toggle
    question = [{"role": "user", "content": "Colours?"}]
    ids = door.prompt_ids(ChatRequest(question))
    off = door.prompt_ids(ChatRequest(question, template_options={"enable_thinking": False}))
    assert off.shape[-1] > ids.shape[-1]  # the template variable reached the template: it wrote an empty block
    pattern = RegexFilter(r"<think>[a-z ]{3,12}</think>\n\n[a-z ]{3,12}")
    shaped = AnswerOptions(settings=SamplerSettings.greedy(), filters=(pattern,))
    chat = answer_with(model, door, ids, shaped, 40)[-1]
    assert chat["full_reasoning"] and chat["full_answer"] and "<think>" not in chat["full_answer"]
    raw = answer_with(model, door, ids, dataclasses.replace(shaped, split_reasoning=False), 40)[-1]
    assert "full_reasoning" not in raw and raw["full_completion"].startswith("<think>")


def test_the_server_goes_through_a_shared_door_and_its_image_embeddings(llava):
    door = door_of(llava, context_length=512)
    picture = png((40, 80, 225))
    mine = door.embed_image(picture)
    served = ServedModel(llava, "m", context=512, chat=door)
    assert served.chat is door and served.reasoning is door.reasoning and served.context == 512

    async def prompt():
        return await served.chat_prompt(ChatInput([user_message(QUESTION, 1)], [picture]))

    try:
        ids, images = asyncio.run(prompt())
    finally:
        asyncio.run(served.close())
    assert images == [mine] and images[0] is mine and len(door.images) == 1  # the tower did not run again
    assert ids.tolist() == door.prompt_ids(ChatRequest([user_message(QUESTION, 1)], images=[mine])).tolist()
    with pytest.raises(ValueError, match="differs from the served context"):
        ServedModel(llava, "m", context=256, chat=door)
