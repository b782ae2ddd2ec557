"""The server and gpt-oss's harmony format: the analysis channel comes back as `reasoning_content` and the final
channel as `content`, whole and streamed, the reply ends at <|return|>, and OpenAI's `reasoning_effort` reaches
the chat template.

The model is a tiny Llama made to write one harmony reply (tests/harmony_models.py), under a harmony template
that writes the effort into its system message; its vocabulary spells "high" in fewer tokens than "low", so the
prompt length in `usage` tells which effort the template was given. Tried: reasoning_effort low and high, in the
field and in chat_template_kwargs, a bad effort, and the two disagreeing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import openai
import pytest

from engine.chat.prompt import encode_chat
from engine.reasoning import HarmonyFormat
from engine.server.served import ServedModel

_spec = importlib.util.spec_from_file_location("server_tests", Path(__file__).with_name("test_server.py"))
_server_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_server_tests)
client = _server_tests.client
_spec = importlib.util.spec_from_file_location("harmony_models", Path(__file__).parents[2] / "harmony_models.py")
harmony_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harmony_models)

QUESTION = [{"role": "user", "content": "Colours?"}]


@pytest.fixture(scope="module")
def harmony_model(tmp_path_factory):
    return harmony_models.build_harmony_llama(tmp_path_factory.mktemp("harmony-llama"))


def test_channels_come_apart_and_the_effort_reaches_the_template(serving, harmony_model):
    served = ServedModel(harmony_model, "m", context=256, max_concurrent=2)
    assert served.reasoning == HarmonyFormat(effort=True)
    length = {
        effort: int(encode_chat(harmony_model.tokenizer, served.template, QUESTION, reasoning_effort=effort).shape[-1])
        for effort in ("low", "high")
    }
    assert length["low"] != length["high"]
    with serving(served) as url:
        c = client(url)
        args = dict(model="m", messages=QUESTION, temperature=0, max_tokens=64)
        for effort in ("low", "high"):
            reply = c.chat.completions.create(**args, reasoning_effort=effort)
            message, choice = reply.choices[0].message, reply.choices[0]
            assert getattr(message, "reasoning_content", None) == harmony_models.THINKING
            assert message.content == harmony_models.ANSWER
            assert choice.finish_reason == "stop"  # at <|return|>, which is not the tokenizer's eos
            assert reply.usage.prompt_tokens == length[effort]

        reasoning = content = ""
        usage = None
        stream = c.chat.completions.create(
            **args, reasoning_effort="low", stream=True, stream_options={"include_usage": True}
        )
        for chunk in stream:
            delta = chunk.choices[0].delta if chunk.choices else None
            reasoning += (getattr(delta, "reasoning_content", None) or "") if delta else ""
            content += (delta.content or "") if delta else ""
            usage = chunk.usage or usage
        assert (reasoning, content) == (harmony_models.THINKING, harmony_models.ANSWER)
        assert "<|" not in reasoning + content
        assert usage.prompt_tokens == length["low"]

        # chat_template_kwargs name it alike; the field and the kwargs must agree
        kwargs = {"chat_template_kwargs": {"reasoning_effort": "high"}}
        assert c.chat.completions.create(**args, extra_body=kwargs).usage.prompt_tokens == length["high"]
        with pytest.raises(openai.BadRequestError, match="disagree"):
            c.chat.completions.create(**args, reasoning_effort="low", extra_body=kwargs)
        with pytest.raises(openai.BadRequestError, match="reasoning_effort must be one of low, medium, high"):
            c.chat.completions.create(**args, reasoning_effort="extreme")
