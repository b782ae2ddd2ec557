"""Request bodies -> job settings and template messages, without a server: defaults, mapping, refusals."""

from __future__ import annotations

import base64

import pytest

from engine.generator.filters import JSONFilter
from engine.generator.sampler import SamplerSettings
from engine.server.errors import APIError
from engine.server.messages import read_messages
from engine.server.params import chat_request, completion_request

USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return chat_request({"model": "m", "messages": USER, **fields})


def refused(make, param: str | None, **fields) -> APIError:
    with pytest.raises(APIError) as caught:
        make(**fields)
    assert caught.value.status == 400 and caught.value.param == param
    return caught.value


def test_openai_defaults_and_greedy_at_temperature_zero():
    g = chat().generation
    s = g.settings
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.token_repetition_penalty) == (1.0, 1.0, 0, 0.0, 1.0)
    assert g.max_tokens is None and g.stop == () and not g.stream and not g.logprobs
    assert chat(temperature=0).generation.settings == SamplerSettings.greedy()
    g = chat(
        temperature=0.5,
        top_p=0.9,
        top_k=-1,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        max_completion_tokens=7,
        stop="\n",
        seed=-1,
        logit_bias={"5": -100},
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        top_logprobs=2,
    ).generation
    s = g.settings
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.5, 0.9, 0, 0.05)
    assert (s.token_repetition_penalty, s.token_presence_penalty, s.token_frequency_penalty) == (1.1, 0.5, -0.5)
    assert g.max_tokens == 7 and g.stop == ("\n",) and g.seed == 2**64 - 1 and g.include_usage
    assert (g.logprobs, g.top_logprobs) == (True, 2)
    assert isinstance(chat(response_format={"type": "json_object"}).generation.filters[0], JSONFilter)


def test_bad_and_unknown_fields_are_refused_by_name():
    refused(chat, "temperature", temperature=2.5)
    refused(chat, "top_k", top_k=1.5)
    refused(chat, "max_tokens", max_tokens=0)
    refused(chat, "max_completion_tokens", max_tokens=5, max_completion_tokens=6)
    refused(chat, "n", n=2)
    refused(chat, "stop", stop=[1])
    refused(chat, "top_logprobs", top_logprobs=2)
    refused(chat, "stream_options", stream_options={"include_usage": True})
    refused(chat, "response_format", response_format={"type": "json_schema", "json_schema": {"schema": 5}})
    refused(chat, "tools[0].function.name", tools=[{"type": "function", "function": {"description": "f"}}])
    assert "temprature" in refused(chat, "temprature", temprature=1).message
    refused(lambda **f: chat_request({"model": "m", **f}), "messages", messages=[])
    refused(lambda **f: completion_request({"model": "m", **f}), "prompt", prompt=["a", "b"])
    refused(lambda **f: completion_request({"model": "m", "prompt": "x", **f}), "echo", echo=True)
    assert completion_request({"model": "m", "prompt": ["x"]}).prompt == "x"
    assert completion_request({"model": "m", "prompt": [1, 2]}).generation.max_tokens == 16  # OpenAI's default


def test_messages_become_template_messages_and_image_bytes():
    png = b"\x89PNG fake"
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    chat_input = read_messages(
        [
            {"role": "developer", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "What?"}, {"type": "image_url", "image_url": {"url": url}}],
            },
            {"role": "assistant", "content": None},
        ]
    )
    assert chat_input.messages == [
        {"role": "system", "content": "Be\nbrief."},
        {"role": "user", "content": [{"type": "text", "text": "What?"}, {"type": "image"}]},
        {"role": "assistant", "content": ""},
    ]
    assert chat_input.images == [png]


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ({"role": "tool", "content": "42"}, "tool"),
        ({"role": "robot", "content": "x"}, "role must be"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}, "only data:"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png,abc"}}]}, "base64"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:;base64,@@"}}]}, "not valid"),
        ({"role": "system", "content": [{"type": "image_url", "image_url": {"url": "data:;base64,"}}]}, "only user"),
        ({"role": "user", "content": [{"type": "input_audio"}]}, "text part"),
    ],
)
def test_messages_the_server_cannot_take_are_refused(message, says):
    with pytest.raises(APIError) as caught:
        read_messages([message])
    assert caught.value.status == 400 and says in caught.value.message
