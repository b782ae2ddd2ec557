"""The server's reasoning replies: a reasoning model's thinking in `reasoning_content`, apart from `content`,
whole and streamed, and chat_template_kwargs reaching the template (enable_thinking).

A tiny random Qwen3 (float32) with a tokenizer whose <think> tags are tokens; the same prompt sent as token
ids to /v1/completions gives the raw text that engine.reasoning must split the way the chat reply did.
Tried: an R1-style template that opens the block itself (everything generated is thinking unless the model
closes it), a Qwen3-style one with thinking switched off by chat_template_kwargs, bad chat_template_kwargs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import openai
import pytest

from engine.chat.prompt import encode_chat
from engine.reasoning import split_reasoning
from engine.server.served import ServedModel

_spec = importlib.util.spec_from_file_location("server_tests", Path(__file__).with_name("test_server.py"))
_server_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_server_tests)
client = _server_tests.client

QUESTION = [{"role": "user", "content": "Colours?"}]


def ask(url: str, stream: bool, **extra) -> tuple[str | None, str]:
    """(reasoning_content, content) of a greedy 16-token chat reply."""
    c = client(url)
    args = dict(model="m", messages=QUESTION, temperature=0, max_tokens=16, **extra)
    if not stream:
        message = c.chat.completions.create(**args).choices[0].message
        return getattr(message, "reasoning_content", None), message.content
    reasoning = content = ""
    for chunk in c.chat.completions.create(**args, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += (delta.content or "") if delta else ""
    return reasoning or None, content


def raw_text(url: str, ids) -> str:
    """What the model writes after prompt `ids` with the same settings, as plain completion text."""
    reply = client(url).completions.create(model="m", prompt=ids[0].tolist(), temperature=0, max_tokens=16)
    return reply.choices[0].text


def test_thinking_comes_apart_from_the_answer_whole_and_streamed(serving, tmp_path, reasoning_models):
    model = reasoning_models.tiny_qwen3(tmp_path, reasoning_models.R1_STYLE)
    served = ServedModel(model, "m", context=256, max_concurrent=2)
    assert served.reasoning is not None
    with serving(served) as url:
        ids = encode_chat(model.tokenizer, served.template, QUESTION)
        prompt = model.tokenizer.decode(ids, decode_special_tokens=True)
        assert prompt.endswith("<think>\n")  # the template opened the block: the reply starts inside it
        reasoning, answer = split_reasoning(raw_text(url, ids), served.reasoning, prompt)
        assert reasoning  # 16 tokens of thinking at least begin
        whole, streamed = ask(url, stream=False), ask(url, stream=True)
        assert whole == (reasoning, answer)
        assert (streamed[0].strip() if streamed[0] else None, streamed[1]) == whole


def test_chat_template_kwargs_switch_thinking_off(serving, tmp_path, reasoning_models):
    model = reasoning_models.tiny_qwen3(tmp_path, reasoning_models.QWEN3_STYLE)
    served = ServedModel(model, "m", context=256, max_concurrent=2)
    with serving(served) as url:
        ids = encode_chat(model.tokenizer, served.template, QUESTION, enable_thinking=False)
        prompt = model.tokenizer.decode(ids, decode_special_tokens=True)
        assert prompt.endswith("<think>\n\n</think>\n\n")
        text = raw_text(url, ids)
        reasoning, content = ask(url, stream=False, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert (reasoning, content) == (None, split_reasoning(text, served.reasoning, prompt)[1]) and content
        for bad in ({"messages": []}, {"enable_thinking": {"a": 1}}, ["enable_thinking"]):
            with pytest.raises(openai.BadRequestError, match="chat_template_kwargs"):
                ask(url, stream=False, extra_body={"chat_template_kwargs": bad})
