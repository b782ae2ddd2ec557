"""python -m engine serve: a real uvicorn server on a free port, driven by the official openai client.

Most tests share one server (the starter, an API key, 8 jobs at once) running in a thread of this process,
so they can also look at its generator's cache pages; one runs the real `python -m engine serve` command.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import importlib.util
import io
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from engine.models import Model
from engine.server.app import ServerOptions
from engine.server.served import ServedModel

ROOT = Path(__file__).resolve().parents[3]
KEY = "test-key"
CONTEXT = 1024
USER = [{"role": "user", "content": "Name three colours."}]


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


def async_client(url: str, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


def raw(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, JSON) of a request sent without the openai client (which always sends a key)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


async def settled(served: ServedModel, seconds: float) -> float:
    """Wait until no request holds a job or a cache page; the seconds it took (fails past `seconds`)."""
    start = time.monotonic()
    while served.in_flight or served.pages_in_use():
        assert time.monotonic() - start < seconds, (
            f"{served.in_flight} requests and {served.pages_in_use()} pages still held"
        )
        await asyncio.sleep(0.01)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def starter_model(starter_gguf):
    return Model.load(starter_gguf)


@pytest.fixture(scope="module")
def server(serving, starter_model):
    """(url, served): the starter behind an API key, 8 jobs at once, 64 KiB bodies at most."""
    served = ServedModel(starter_model, "starter", context=CONTEXT, max_concurrent=8)
    with serving(served, ServerOptions(api_key=KEY, max_body_bytes=64 * 1024)) as url:
        yield url, served


# --------------------------------------------------------------------------------------------- answers


def test_models_and_health(server):
    url, served = server
    assert [m.id for m in client(url).models.list().data] == ["starter"]
    status, health = raw(url, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["cache_pages"] == served.cache.num_pages


def test_chat_whole_and_streamed_with_usage_and_cached_tokens(server):
    url, _ = server
    c = client(url)
    whole = c.chat.completions.create(model="starter", messages=USER, temperature=0, max_tokens=24)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason in ("stop", "length")
    assert 0 < whole.usage.completion_tokens <= 24 and whole.usage.prompt_tokens > 10

    chunks = list(
        c.chat.completions.create(
            model="starter",
            messages=USER,
            temperature=0,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-2].choices[0].finish_reason
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and all(ch.usage is None for ch in chunks[:-1])
    assert usage.prompt_tokens == whole.usage.prompt_tokens and 0 < usage.completion_tokens <= 24
    # The same prompt again: all of it but the last token (always recomputed) comes from the prefix cache.
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


# Each its own system message, so prompts share only a few tokens and every prompt is computed by the same
# attention kernels whatever else runs (see test_a_repeated_greedy_request_gives_the_same_text).
PROMPTS = [
    [{"role": "system", "content": f"You are helper {i}."}, {"role": "user", "content": q}]
    for i, q in enumerate(
        [
            "What is a cat?",
            "Write a haiku about rain.",
            "What is 12 times 7?",
            "Name a planet.",
            "Why is the sky blue?",
            "Say hello in French.",
            "What do bees make?",
            "Name a large river.",
        ]
    )
]


async def ask(c, messages, stream: bool, max_tokens: int = 24) -> str:
    args = dict(model="starter", messages=messages, temperature=0, max_tokens=max_tokens)
    if not stream:
        return (await c.chat.completions.create(**args)).choices[0].message.content
    chunks = await c.chat.completions.create(**args, stream=True)
    return "".join([ch.choices[0].delta.content or "" async for ch in chunks])


def test_concurrent_requests_equal_their_solo_answers(serving, starter_model):
    # Two fresh servers, so each prompt meets the same (empty) cache alone and beside the others.
    async def solo(url):
        c = async_client(url)
        return [await ask(c, p, stream=i % 2 == 0) for i, p in enumerate(PROMPTS)]

    async def together(url):
        c = async_client(url)
        return list(await asyncio.gather(*(ask(c, p, stream=i % 2 == 1) for i, p in enumerate(PROMPTS))))

    answers = []
    for run in (solo, together):
        served = ServedModel(starter_model, "starter", context=CONTEXT, max_concurrent=8)
        with serving(served) as url:
            answers.append(asyncio.run(run(url)))
    assert all(answers[0]) and answers[1] == answers[0]


def test_a_repeated_greedy_request_gives_the_same_text(serving, starter_model):
    served = ServedModel(starter_model, "starter", context=CONTEXT, max_concurrent=8)
    with serving(served) as url:

        async def twice():
            c = async_client(url)
            return [await ask(c, USER, False) for _ in range(2)]

        first, again = asyncio.run(twice())
    assert again == first  # the second finds the prompt in the prefix cache (kernels/cpu/attention.py)


def test_greedy_equals_engine_generate_and_serve_prints_its_url(starter_gguf):
    prompt, limit = "Tell me about the moon.", 40
    cmd = [sys.executable, "-m", "engine"]
    serve = subprocess.Popen(
        [*cmd, "serve", str(starter_gguf), "--port", "0", "--context", "512", "--model-id", "m"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        generate = subprocess.run(
            [
                *cmd,
                "generate",
                str(starter_gguf),
                "--chat",
                "--greedy",
                "--prompt",
                prompt,
                "--max-new-tokens",
                str(limit),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert generate.returncode == 0, generate.stderr
        line = serve.stdout.readline()
        assert line.startswith("Serving m at http://127.0.0.1:"), line + serve.stderr.read()
        url = line.split(" at ")[1].split()[0]
        answer = client(url, key="none needed").chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=limit
        )
        assert answer.choices[0].message.content == generate.stdout.removesuffix("\n")
    finally:
        serve.terminate()
        serve.wait(30)


def test_json_object_and_json_schema_replies_parse(server):
    url, _ = server
    c = client(url)
    reply = c.chat.completions.create(
        model="starter",
        messages=[{"role": "user", "content": "Describe a cat as JSON with a name and an age."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=120,
    )
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
        "additionalProperties": False,
    }
    reply = c.chat.completions.create(
        model="starter",
        messages=[{"role": "user", "content": "Pick a colour and a count."}],
        response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}},
        temperature=0.7,
        seed=3,
        max_tokens=60,
    )
    value = json.loads(reply.choices[0].message.content)
    assert value["colour"] in ("red", "green", "blue") and isinstance(value["count"], int)


def test_completions_logprobs_and_stop(server):
    url, _ = server
    c = client(url)
    reply = c.completions.create(model="starter", prompt="One, two, three,", max_tokens=12, temperature=0, logprobs=2)
    choice = reply.choices[0]
    assert choice.text and "".join(choice.logprobs.tokens) == choice.text
    for token, logprob, top in zip(
        choice.logprobs.tokens, choice.logprobs.token_logprobs, choice.logprobs.top_logprobs
    ):
        assert token in top and logprob == top[token] == max(top.values())  # greedy took a most likely token
    cut = c.completions.create(model="starter", prompt="One, two, three,", max_tokens=12, temperature=0, stop=[","])
    assert cut.choices[0].text == choice.text.split(",")[0] and cut.choices[0].finish_reason == "stop"

    chat = c.chat.completions.create(
        model="starter", messages=USER, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3
    )
    entries = chat.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == chat.choices[0].message.content
    assert all(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob == e.logprob <= 0 for e in entries)


def test_presence_and_frequency_penalties_count_the_completion_not_the_prompt(server):
    # OpenAI's rule (and vLLM's): the prompt's tokens take no presence or frequency penalty. A counting prompt
    # whose greedy next word is already in it three times: counted over the prompt (the engine's own rule),
    # penalties of 2 would take 2 + 3 x 2 from that word, more than its lead over the runner-up.
    url, _ = server
    c = client(url)
    prompt = "One, two, three, one, two, three, one, two, three, one, two,"
    penalties = dict(frequency_penalty=2.0, presence_penalty=2.0)
    plain = c.completions.create(model="starter", prompt=prompt, max_tokens=16, temperature=0, logprobs=2)
    first = plain.choices[0].logprobs.tokens[0]
    lead = (
        -sorted(plain.choices[0].logprobs.top_logprobs[0].values(), reverse=True)[1]
        + plain.choices[0].logprobs.token_logprobs[0]
    )
    times = prompt.lower().count(first.lower())
    assert times >= 3 and lead < 2.0 + 2.0 * times  # the prompt's count alone would have turned the choice
    penalised = c.completions.create(
        model="starter", prompt=prompt, max_tokens=16, temperature=0, logprobs=2, **penalties
    )
    assert penalised.choices[0].logprobs.tokens[0] == first
    assert penalised.choices[0].text != plain.choices[0].text  # the completion's own repeats are penalised


def test_a_vision_model_reads_data_url_images(serving):
    if "demo_vision_shapes" not in sys.modules:  # a development tool, not a package: loaded by path
        spec = importlib.util.spec_from_file_location("demo_vision_shapes", ROOT / "tools/demo_vision/shapes.py")
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
        spec.loader.exec_module(sys.modules[spec.name])
    shapes = sys.modules["demo_vision_shapes"]
    png = io.BytesIO()
    shapes.render_objects([("red", "circle"), ("blue", "square")]).save(png, format="PNG")
    image = {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()},
    }
    served = ServedModel(Model.load(ROOT / "assets/demo-vision"), "demo", context=256, max_concurrent=2)
    with serving(served) as url:
        reply = client(url).chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": [image, {"type": "text", "text": "Describe this image."}]}],
            temperature=0,
            max_tokens=30,
        )
    assert reply.choices[0].message.content == "A red circle and a blue square."


# ---------------------------------------------------------------------------------------------- errors


def test_each_error_has_openai_shape_and_status(server):
    url, served = server
    c = client(url)
    base = dict(model="starter", messages=USER, max_tokens=4)

    def fails(error_type, **args):
        with pytest.raises(error_type) as caught:
            c.chat.completions.create(**{**base, **args})
        return caught.value

    assert fails(openai.BadRequestError, temperature=3).param == "temperature"
    assert "temprature" in fails(openai.BadRequestError, extra_body={"temprature": 0.5}).message
    long = fails(openai.BadRequestError, messages=[{"role": "user", "content": "word " * 1500}])
    assert long.code == "context_length_exceeded" and str(CONTEXT) in long.message
    assert "1500" in fails(openai.BadRequestError, max_tokens=1500).message
    served.context, context = 8192, served.context  # room for more logits than a logprobs job may keep
    try:
        assert fails(openai.BadRequestError, max_tokens=8000, logprobs=True).param == "max_tokens"
    finally:
        served.context = context
    web = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert "only data: URLs" in fails(openai.BadRequestError, messages=[{"role": "user", "content": [web]}]).message
    inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    assert (
        "cannot see images" in fails(openai.BadRequestError, messages=[{"role": "user", "content": [inline]}]).message
    )
    assert fails(openai.NotFoundError, model="gpt-4o").code == "model_not_found"

    with pytest.raises(openai.AuthenticationError):
        client(url, key="wrong").models.list()
    status, body = raw(url, "POST", "/v1/chat/completions", json.dumps(base).encode())
    assert status == 401 and body["error"]["code"] == "invalid_api_key"

    huge = fails(openai.APIStatusError, messages=[{"role": "user", "content": "x" * 70_000}])
    assert huge.status_code == 413 and "65536" in huge.message
    status, body = raw(url, "GET", "/v1/nothing")
    assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}


def test_a_full_queue_answers_503_until_a_slot_frees(serving, starter_model):
    served = ServedModel(starter_model, "starter", context=CONTEXT, max_concurrent=1, max_queue=0)
    with serving(served) as url:
        c = client(url)
        long = c.chat.completions.create(
            model="starter", messages=USER, max_tokens=900, stream=True, extra_body={"min_tokens": 900}
        )
        next(iter(long))  # its job is enqueued
        with pytest.raises(openai.InternalServerError) as caught:
            c.chat.completions.create(model="starter", messages=USER, max_tokens=4)
        assert caught.value.status_code == 503 and "--max-concurrent 1" in caught.value.message
        long.close()
        asyncio.run(settled(served, 3))
        assert c.chat.completions.create(model="starter", messages=USER, max_tokens=4).choices[0].message.content


def send_and_leave_open(url: str, body: dict) -> socket.socket:
    """A non-streaming request written to a raw socket, whose reply nobody will wait for."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port))
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.hostname}\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


@pytest.mark.timing
def test_clients_that_drop_mid_stream_free_their_pages_at_once(server):
    url, served = server
    long = dict(model="starter", max_tokens=600, extra_body={"min_tokens": 600})

    async def drop(c, i: int) -> None:
        messages = [{"role": "user", "content": f"Count from {i} to 1000."}]
        stream = await c.chat.completions.create(messages=messages, stream=True, **long)
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 4:
                break
        await stream.close()

    async def main():
        c = async_client(url)
        await asyncio.gather(*(drop(c, i) for i in range(12)))
        # 12 jobs of 600 tokens would take many seconds to finish on their own: they must have been cancelled.
        await settled(served, 2)
        # Clients of whole (non-streamed) replies that give up are noticed too.
        body = {"model": "starter", "messages": USER, "max_tokens": 600, "min_tokens": 600}
        socks = [send_and_leave_open(url, body) for _ in range(2)]
        while served.in_flight < 2:
            await asyncio.sleep(0.01)
        for sock in socks:
            sock.close()
        await settled(served, 2)
        start = time.monotonic()
        reply = await c.chat.completions.create(model="starter", messages=USER, max_tokens=8)
        return reply, time.monotonic() - start

    reply, seconds = asyncio.run(main())
    assert reply.choices[0].message.content and seconds < 5
    assert served.generator.generator.num_remaining_jobs() == 0
