"""engine.chat.overflow through the front door, on the tiny model's real tokenizer and ChatML template: what each
policy keeps, that the kept prefix stays the same for several turns (so the prefix cache keeps hitting), and that
`stop` refuses as before.

Bad inputs tried: a policy name that does not exist, a last message longer than the whole context, a picture in
a dropped turn (its embedding leaves the prompt with it).
"""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from engine import Model
from engine.chat.door import ChatFrontDoor
from engine.chat.errors import ContextOverflow
from engine.chat.overflow import OverflowPolicy
from engine.chat.request import AnswerOptions, ChatRequest
from engine.chat_template import ChatTemplate
from engine.tokenizer.tokenizer import Tokenizer
from engine.vision.embedding import is_mm_id
from engine.vision.handle import vision_of
from engine.vision.prompt import user_message

CONTEXT = 512
ANSWER = AnswerOptions(max_new_tokens=64)
SYSTEM = "You are a patient helper."


@pytest.fixture(scope="module")
def door(tiny_folder):
    tokenizer = Tokenizer.load(tiny_folder)
    return ChatFrontDoor(None, tokenizer, ChatTemplate.from_tokenizer(tokenizer), context_length=CONTEXT)


def chat(turns: int) -> list[dict]:
    """A conversation of `turns` exchanges and the next question (about 35 tokens a turn): chat(n + 1) is
    chat(n) answered and asked on."""
    messages = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Q{t}: next after {t}?"})
        messages.append({"role": "assistant", "content": f"{t + 1} follows {t}."})
    messages.append({"role": "user", "content": f"Q{turns}: next after {turns}?"})
    return messages


def png(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 40), color).save(out, "PNG")
    return out.getvalue()


def ask(door, messages, policy) -> ChatRequest:
    return ChatRequest(messages, system_prompt=SYSTEM, answer=ANSWER, overflow=policy)


def test_truncate_middle_keeps_the_system_prompt_and_first_exchange_and_fits(door):
    messages = chat(60)
    prompt = door.prompt(ask(door, messages, "truncate-middle"))
    assert prompt.ids.shape[-1] <= CONTEXT - 64
    assert prompt.dropped.start == 2 and prompt.first_seen == prompt.dropped.stop < len(messages) - 1
    assert messages[prompt.first_seen]["role"] == "user"  # the view resumes at a question
    text = door.tokenizer.decode(prompt.ids[0])
    for kept in (SYSTEM, messages[0]["content"], messages[1]["content"], messages[-1]["content"]):
        assert kept in text
    assert messages[2]["content"] not in text and messages[prompt.first_seen - 1]["content"] not in text
    assert messages[prompt.first_seen]["content"] in text
    assert door.fit(int(prompt.ids.shape[-1]), ANSWER) == 64


def test_the_kept_prefix_stays_the_same_for_several_turns(door):
    """Turn after turn the previous prompt is a prefix of the next (its cached pages hit) until a block jump, and
    a jump frees room for about budget / (4 * tokens per turn) turns: 448 / (4 * 35), so about 3."""
    cut, reused, jumps, previous = None, 0, 0, None
    for turns in range(10, 60):
        prompt = door.prompt(ask(door, chat(turns), OverflowPolicy.TRUNCATE_MIDDLE))
        ids = prompt.ids[0].tolist()
        is_prefix = previous is not None and ids[: len(previous) - 3] == previous[:-3]  # less "<|im_start|>assistant\n"
        if prompt.first_seen == cut:
            assert is_prefix, f"turn {turns} kept the cut at {cut} but changed the prompt before it"
            reused += 1
        else:
            assert cut is None or prompt.first_seen > cut
            jumps += 1
        cut, previous = prompt.first_seen, ids
    assert jumps >= 5, "the chats should overflow and drop turns"
    assert reused >= 2 * jumps, f"only {reused} of 50 turns reused the previous prompt ({jumps} jumps)"


def test_a_rolling_window_keeps_the_system_prompt_only(door):
    messages = chat(60)
    prompt = door.prompt(ask(door, messages, "rolling-window"))
    text = door.tokenizer.decode(prompt.ids[0])
    assert prompt.ids.shape[-1] <= CONTEXT - 64 and prompt.dropped.start == 0
    assert SYSTEM in text and messages[0]["content"] not in text and messages[-1]["content"] in text


def test_a_chat_that_fits_is_kept_whole(door):
    messages = chat(2)
    for policy in OverflowPolicy:
        prompt = door.prompt(ask(door, messages, policy))
        assert not prompt.dropped and prompt.first_seen is None
        assert prompt.ids.tolist() == door.prompt_ids(ChatRequest(messages, system_prompt=SYSTEM)).tolist()


def test_stop_keeps_everything_and_the_context_check_refuses_as_before(door):
    messages = chat(60)
    prompt = door.prompt(ask(door, messages, "stop"))
    assert not prompt.dropped and prompt.ids.shape[-1] > CONTEXT
    with pytest.raises(ContextOverflow, match="does not fit the context of 512 tokens"):
        door.fit(int(prompt.ids.shape[-1]), ANSWER)


def test_a_last_message_longer_than_the_context_is_still_refused(door):
    messages = chat(3)
    messages[-1] = {"role": "user", "content": "apples and pears " * 100}
    prompt = door.prompt(ask(door, messages, "truncate-middle"))
    assert prompt.first_seen == len(messages) - 1  # everything droppable was dropped
    with pytest.raises(ContextOverflow):
        door.fit(int(prompt.ids.shape[-1]), ANSWER)


def test_an_unknown_policy_name_says_which_exist():
    with pytest.raises(ValueError, match="stop, truncate-middle, rolling-window"):
        ChatRequest([], overflow="truncate-start")


def test_the_images_of_dropped_turns_leave_the_prompt_with_them(tiny_llava_folder):
    model = Model.load(tiny_llava_folder, dtype=torch.float32)
    template = ChatTemplate.from_tokenizer(model.tokenizer)
    door = ChatFrontDoor(model, model.tokenizer, template, context_length=CONTEXT, vision=vision_of(model))
    first, middle, last = (door.embed_image(png(c)) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255)))
    messages = [user_message("What is this?", 1), {"role": "assistant", "content": "Red."}]
    messages += [user_message("And this?", 1), {"role": "assistant", "content": "Green."}]
    messages += chat(30)[:-1] + [user_message("And the last one?", 1)]
    request = ChatRequest(messages, images=[first, middle, last], answer=ANSWER, overflow="truncate-middle")
    prompt = door.prompt(request)
    assert prompt.dropped.start == 2 and prompt.first_seen > 3  # the green picture's turn was dropped
    assert prompt.images == (first, last)
    ids = prompt.ids[0].tolist()
    assert sum(is_mm_id(i) for i in ids) == first.num_tokens + last.num_tokens
    assert prompt.ids.shape[-1] <= CONTEXT - 64
