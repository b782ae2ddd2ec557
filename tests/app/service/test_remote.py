"""RemoteBackend against real servers: our own `engine.server` (the starter, in a thread of this process, so
the tests can look at its cache pages) and small raw-socket servers that misbehave on purpose (an HTML page,
a stream cut halfway, a server that stalls). Third-party servers are in test_remote_third_party.py."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import openai
import pytest

from app.service.generation import GenerationSettings
from app.service.remote import RemoteBackend
from app.service.remote_errors import (
    RemoteAuthError,
    RemoteBadReply,
    RemoteError,
    RemoteNotFound,
    RemoteRefused,
    RemoteStreamCut,
    RemoteTimeout,
    RemoteUnreachable,
)
from engine import SamplerSettings
from engine.models import Model
from engine.server.app import ServerOptions, create_app
from engine.server.command import bind, make_server, url_of
from engine.server.served import ServedModel

REPO = Path(__file__).resolve().parents[3]
KEY = "remote-test-key"
USER = [{"role": "user", "content": "Name three colours."}]


def settings(**changes) -> GenerationSettings:
    """Greedy settings, 24 tokens at most, with `changes` (sampler fields or job fields)."""
    return GenerationSettings(SamplerSettings.greedy(), max_new_tokens=24).replace(**changes)


@contextmanager
def running(served: ServedModel, options: ServerOptions):
    """`python -m engine serve`'s server on a free port of 127.0.0.1, in a thread; yields its base URL."""
    server = make_server(create_app(served, options))
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), name="test-uvicorn")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def ours(starter_gguf):
    """(base URL, served model): the starter as 'starter' behind an API key, 1024 tokens of context."""
    served = ServedModel(Model.load(starter_gguf), "starter", context=1024, max_concurrent=4)
    with running(served, ServerOptions(api_key=KEY)) as url:
        yield url, served


async def collect(job) -> list[dict]:
    return [result async for result in job]


async def partial_and_error(job) -> tuple[str, RemoteError]:
    """The text a failing job streamed before its error, and the error."""
    text = ""
    with pytest.raises(RemoteError) as caught:
        async for result in job:
            text += result["text"]
    return text, caught.value


async def ask(backend: RemoteBackend, messages=USER, system_prompt=None, images=(), **changes):
    return await backend.start_answer(messages, system_prompt, list(images), settings(**changes))


async def settled(served: ServedModel, seconds: float) -> None:
    """Wait until the server holds no request and no cache page (fails past `seconds`)."""
    start = time.monotonic()
    while served.in_flight or served.pages_in_use():
        assert time.monotonic() - start < seconds, f"{served.in_flight} requests, {served.pages_in_use()} pages held"
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------------------------------- our server


def test_lists_models_and_reads_the_context(ours):
    url, served = ours
    backend = RemoteBackend(url, api_key=KEY)
    assert not backend.is_loaded and backend.context_length == 0
    assert asyncio.run(backend.list_models()) == ["starter"]
    assert backend.is_loaded and backend.name == "starter" and backend.context_length == served.context == 1024
    assert backend.count_tokens([{"role": "user", "content": "hi"}]) is None and not backend.can_see_images


def test_streamed_greedy_answer_equals_the_servers_own_with_stats(ours):
    url, _ = ours
    system = "You answer in one short sentence."
    reference = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0).chat.completions.create(
        model="starter",
        messages=[{"role": "system", "content": system}, *USER],
        temperature=0,
        max_tokens=24,
    )
    backend = RemoteBackend(url, api_key=KEY, model="starter")

    async def main():
        job = await backend.start_answer(USER, system, [], settings(), identifier="tab-1")
        return job, await collect(job)

    job, results = asyncio.run(main())
    *chunks, last = results
    assert len(chunks) > 3 and all(r["stage"] == "streaming" and not r["eos"] and r["text"] for r in chunks)
    assert all(r["job"] is job and r["identifier"] == "tab-1" for r in results)
    text = "".join(r["text"] for r in chunks)
    assert text == last["full_completion"] == reference.choices[0].message.content
    assert (
        last["eos"]
        and last["eos_reason"] == {"stop": "stop_token", "length": "max_new_tokens"}[reference.choices[0].finish_reason]
    )
    assert last["new_tokens"] == reference.usage.completion_tokens
    assert last["prompt_tokens"] == reference.usage.prompt_tokens
    # The reference request left the prompt in the server's prefix cache: all but its last token is reused.
    assert last["cached_tokens"] == last["prompt_tokens"] - 1
    assert last["time_enqueued"] > 0 and last["time_prefill"] > 0 and last["time_generate"] > 0


SEEDED = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02, token_repetition_penalty=1.05, seed=11)


def test_sampling_settings_and_json_mode_reach_the_server(ours):
    url, _ = ours
    backend = RemoteBackend(url, api_key=KEY, model="starter")
    body = backend.request_body(
        USER,
        settings(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, token_repetition_penalty=1.1, seed=5),
    )
    assert {k: body[k] for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")} == {
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.9,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "seed": 5,
    }

    async def main():
        sampled = [await collect(await ask(backend, **SEEDED)) for _ in range(2)]
        prompt = [{"role": "user", "content": "Describe a cat as JSON with a name and an age."}]
        as_json = await collect(await ask(backend, prompt, json_mode=True, max_new_tokens=120))
        return sampled, as_json

    sampled, as_json = asyncio.run(main())
    # The server accepted every sampler field, and the seed makes the sampled answer repeat.
    assert sampled[0][-1]["full_completion"] == sampled[1][-1]["full_completion"] != ""
    assert isinstance(json.loads(as_json[-1]["full_completion"]), dict)


def test_api_key_model_and_url_errors_say_what_to_do(ours):
    url, _ = ours

    async def main():
        errors = {}
        for name, backend in {
            "wrong key": RemoteBackend(url, api_key="wrong", model="starter"),
            "no key": RemoteBackend(url, model="starter"),
            "unknown model": RemoteBackend(url, api_key=KEY, model="gpt-4o"),
            "no /v1": RemoteBackend(url.removesuffix("/v1"), api_key=KEY, model="starter"),
        }.items():
            errors[name] = (await partial_and_error(await ask(backend)))[1]
        with pytest.raises(RemoteAuthError):
            await RemoteBackend(url, api_key="wrong").list_models()
        return errors

    errors = asyncio.run(main())
    for name in ("wrong key", "no key"):
        assert isinstance(errors[name], RemoteAuthError) and "refused the API key (401)" in str(errors[name])
    assert isinstance(errors["unknown model"], RemoteNotFound)
    assert "does not know the model 'gpt-4o'" in str(errors["unknown model"])
    assert isinstance(errors["no /v1"], RemoteNotFound) and "ends in /v1" in str(errors["no /v1"])


def test_cancel_closes_the_stream_and_the_server_frees_its_pages(ours):
    url, served = ours
    backend = RemoteBackend(url, api_key=KEY, model="starter")
    count = [{"role": "user", "content": "Count from 1 to 500, one number per line."}]

    async def main():
        job = await ask(backend, count, max_new_tokens=800)
        seen = []
        async for result in job:
            seen.append(result)
            if len(seen) == 3:
                assert await job.cancel()
                await settled(served, 2)  # at once: 800 tokens would take many seconds to finish
        assert not any(r["eos"] for r in seen) and not await job.cancel()

        # Leaving `async for` early drops the connection too, as leaving an engine job cancels it.
        job = await ask(backend, count, max_new_tokens=800)
        async for _ in job:
            break
        await settled(served, 2)
        return await collect(await ask(backend, max_new_tokens=4))

    assert asyncio.run(main())[-1]["eos"]


def test_images_go_as_data_urls_only_when_the_model_sees_images(shapes_png):
    picture = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]}]
    served = ServedModel(Model.load(REPO / "assets/demo-vision"), "demo", context=256, max_concurrent=2)
    with running(served, ServerOptions()) as url:

        async def main():
            blind = RemoteBackend(url, model="demo")
            with pytest.raises(ValueError, match="not marked as seeing images"):
                await ask(blind, picture, images=[shapes_png])
            seeing = RemoteBackend(url, model="demo", sees_images=True)
            return await collect(await ask(seeing, picture, images=[shapes_png], max_new_tokens=30))

        results = asyncio.run(main())
    assert results[-1]["full_completion"] == "A red circle and a blue square."


def test_a_text_only_server_refusing_images_says_so(ours, shapes_png):
    url, _ = ours
    backend = RemoteBackend(url, api_key=KEY, model="starter", sees_images=True)
    picture = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]

    async def main():
        with pytest.raises(ValueError, match="2 images were given for 1 image parts"):
            await ask(backend, picture, images=[shapes_png, shapes_png])
        with pytest.raises(ValueError, match="is not an image Pillow can read"):
            await ask(backend, picture, images=[Path(__file__)])
        return await partial_and_error(await ask(backend, picture, images=[shapes_png]))

    text, error = asyncio.run(main())
    assert text == "" and isinstance(error, RemoteRefused) and error.status == 400
    assert "cannot see images" in str(error)


def test_streams_and_stops_on_the_apps_qasync_loop(ours, loop):
    # qasync installs no async-generator hooks: nothing of a stream may be left for the garbage collector to
    # close outside the loop (run with -W error::pytest.PytestUnraisableExceptionWarning to see it would).
    url, served = ours
    backend = RemoteBackend(url, api_key=KEY)
    count = [{"role": "user", "content": "Count from 1 to 500, one number per line."}]

    async def main():
        await backend.list_models()
        whole = await collect(await ask(backend, max_new_tokens=8))
        job = await ask(backend, count, max_new_tokens=800)
        async for _ in job:
            if job.is_running:  # the first piece (results already queued still come after the cancel)
                assert await job.cancel()
        job = await ask(backend, count, max_new_tokens=800)
        async for _ in job:
            break
        await settled(served, 2)
        return whole

    results = loop.run_until_complete(main())
    assert results[-1]["eos"] and results[-1]["new_tokens"] <= 8 and results[-1]["full_completion"]


# ----------------------------------------------------------------------------------- misbehaving servers


async def read_request(reader: asyncio.StreamReader) -> str:
    """Read one request; its request line ("POST /v1/chat/completions HTTP/1.1")."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
    await reader.readexactly(int(length.group(1)) if length else 0)
    return head.split(b"\r\n", 1)[0].decode()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, asyncio.Event], Awaitable[None]]
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()


@asynccontextmanager
async def raw_server(handler: Handler, lists_models: bool = True):
    """A plain asyncio HTTP server on a free port answering chat requests with `handler` (and GET
    /v1/models with one model 'm' when `lists_models`, else with `handler` too); yields its base URL.
    Handlers that stall wait for the event the server sets when the test is done."""
    done = asyncio.Event()

    async def serve(reader, writer):
        try:
            request = await read_request(reader)
            if lists_models and request.startswith("GET /v1/models "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
                await writer.drain()
            else:
                await handler(reader, writer, done)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        done.set()
        server.close()
        await server.wait_closed()


def sse_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def sse_chunk(text: str) -> bytes:
    event = "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [{"delta": {"content": text}}]})
    data = (event + "\n\n").encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def test_an_unreachable_port_says_so():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    backend = RemoteBackend(f"http://127.0.0.1:{port}/v1", model="m")

    async def main():
        with pytest.raises(RemoteUnreachable, match="Cannot reach"):
            await backend.list_models()
        return await partial_and_error(await ask(backend))

    text, error = asyncio.run(main())
    assert text == "" and isinstance(error, RemoteUnreachable) and "server is running" in str(error)


def test_an_html_page_is_not_an_openai_reply():
    page = b"<!DOCTYPE html><html><body><h1>Welcome to nginx!</h1></body></html>"

    async def html(reader, writer, done):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))
        await writer.drain()

    async def main():
        async with raw_server(html, lists_models=False) as url:
            with pytest.raises(RemoteBadReply, match="did not answer like an OpenAI-compatible API"):
                await RemoteBackend(url).list_models()
            return await partial_and_error(await ask(RemoteBackend(url, model="m")))

    text, error = asyncio.run(main())
    assert isinstance(error, RemoteBadReply) and "text/html" in str(error) and "Welcome to nginx!" in str(error)


def test_a_stream_cut_halfway_keeps_the_text_that_came():
    async def cut(reader, writer, done):
        writer.write(sse_head() + sse_chunk("Hello") + sse_chunk(" wor"))
        await writer.drain()
        # The server dies here: the connection closes in the middle of the chunked body.

    async def main():
        async with raw_server(cut) as url:
            return await partial_and_error(await ask(RemoteBackend(url, model="m")))

    text, error = asyncio.run(main())
    assert text == "Hello wor" and isinstance(error, RemoteStreamCut)
    assert "cut off after 9 characters" in str(error) and "is kept" in str(error)


@pytest.mark.timing
def test_a_server_that_stops_sending_times_out():
    async def stall(reader, writer, done):
        writer.write(sse_head() + sse_chunk("Once upon"))
        await writer.drain()
        await done.wait()

    async def silent(reader, writer, done):
        await done.wait()

    async def main():
        async with raw_server(stall) as stalled, raw_server(silent) as quiet:
            start = time.monotonic()
            first = await partial_and_error(await ask(RemoteBackend(stalled, model="m", timeout=0.5)))
            second = await partial_and_error(await ask(RemoteBackend(quiet, model="m", timeout=0.5)))
            return first, second, time.monotonic() - start

    (text, error), (nothing, silence), seconds = asyncio.run(main())
    assert text == "Once upon" and isinstance(error, RemoteTimeout) and "sent nothing for 0.5 s" in str(error)
    assert "9 characters received so far are kept" in str(error)
    assert nothing == "" and isinstance(silence, RemoteTimeout) and seconds < 5
