"""The app's local server over a real EngineService (tiny model, real qasync loop), driven by the openai client.

The server runs on its own thread, so a blocking openai call from the test's thread is answered without the
window's loop running; where a chat job runs at the same time, the call goes to a worker thread instead.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import time

import keyring
import openai
import pytest
import torch
from keyring.backends import null

from app.service import EngineService
from app.service.app_server import AppServer, ServerError
from app.store import Store

TIMEOUT = 90
USER = [{"role": "user", "content": "The quick brown fox"}]
CHAT_TOKENS = 300  # long enough to still be generating when the request arrives
NO_EOS_CHAT = {"temperature": 1.0, "top_k": 1, "top_p": 1.0, "token_repetition_penalty": 1.0}


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT))


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=TIMEOUT)


@pytest.fixture
def no_keyring():
    """No OS keyring (as on a headless box): the key goes to the settings, and no real keyring is touched."""
    before = keyring.get_keyring()
    keyring.set_keyring(null.Keyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture
def store(tmp_path, monkeypatch, no_keyring):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    s = Store()
    yield s
    s.close()


@pytest.fixture
def service(loop):
    # Small pages, so a short chat prompt fills whole pages that later jobs can find in the prefix cache.
    svc = EngineService(dtype=torch.float32, page_size=16)
    yield svc
    run(loop, svc.close())


@pytest.fixture
def loaded(loop, service, tiny_folder):
    service.load_model(tiny_folder, "tiny")
    assert run(loop, service.wait_loaded())
    return service


@pytest.fixture
def server(loop, store, loaded):
    srv = AppServer(store, loaded)
    yield srv
    run(loop, srv.stop())


def test_answers_with_the_chats_model_and_logs_the_request(loop, server, loaded):
    url = run(loop, server.start(port=0))
    assert server.is_running and server.url == url and url.startswith("http://127.0.0.1:")
    c = client(url)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    reply = c.chat.completions.create(model="tiny", messages=USER, max_tokens=8, temperature=0)
    assert reply.model == "tiny" and reply.usage.completion_tokens > 0
    assert reply.choices[0].message.content is not None

    records = [r for r in server.requests if r.path == "/v1/chat/completions"]
    assert len(records) == 1
    rec = records[0]
    assert (rec.method, rec.status, rec.completion_tokens) == ("POST", 200, reply.usage.completion_tokens)
    assert rec.prompt_tokens == reply.usage.prompt_tokens
    assert "POST /v1/chat/completions  200" in rec.line() and f"+{rec.completion_tokens} tokens" in rec.line()


def test_a_chat_and_a_request_share_the_generator_and_its_cache(loop, server, loaded):
    """Both jobs run at once on the service's one generator, and the request finds the chat's prompt cached."""
    url = run(loop, server.start(port=0))
    inner = loaded.serving().generator.generator
    ids = loaded.encode_chat(USER, "")
    settings = dict(NO_EOS_CHAT, disallowed_tokens=sorted(loaded.tokenizer.eos_token_ids))

    async def both():
        seen: list[dict] = []
        job = loaded.start_job(ids, settings, max_new_tokens=CHAT_TOKENS, seed=1)

        async def chat():
            async for r in job:
                seen.append(r)

        chat_task = asyncio.ensure_future(chat())
        while not seen:  # the chat's prompt is in and its pages are hashed: ask for the same conversation
            await asyncio.sleep(0.005)
        request = asyncio.ensure_future(
            asyncio.to_thread(
                lambda: client(url).chat.completions.create(
                    model="tiny", messages=USER, max_tokens=24, temperature=0, extra_body={"min_tokens": 24}
                )
            )
        )
        most = 0
        while not request.done():
            most = max(most, inner.num_active_jobs())
            await asyncio.sleep(0.001)
        await chat_task
        return seen, await request, most

    chat_out, reply, most = run(loop, both())
    assert most == 2, "the chat's job and the request's job never ran in one batch"
    assert sum(r["token_ids"].shape[-1] for r in chat_out if "token_ids" in r) == CHAT_TOKENS
    assert reply.usage.completion_tokens == 24
    # The chat's prompt pages were in the shared cache: the request did not compute them again.
    assert reply.usage.prompt_tokens_details.cached_tokens >= 16


def test_no_model_means_503_and_a_swap_is_followed(loop, store, service, tiny_folder, tmp_path):
    srv = AppServer(store, service)
    url = run(loop, srv.start(port=0))
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client(url).models.list()
        assert e.value.status_code == 503 and "No model is loaded" in str(e.value)

        service.load_model(tiny_folder, "tiny")
        assert run(loop, service.wait_loaded())
        assert [m.id for m in client(url).models.list().data] == ["tiny"]

        other = tmp_path / "other"
        shutil.copytree(tiny_folder, other)
        service.load_model(other, "other")
        assert run(loop, service.wait_loaded())
        c = client(url)
        assert [m.id for m in c.models.list().data] == ["other"]
        reply = c.chat.completions.create(model="other", messages=USER, max_tokens=4)
        assert reply.model == "other"
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="tiny", messages=USER, max_tokens=4)
    finally:
        run(loop, srv.stop())


def test_a_swap_ends_a_request_in_flight(loop, server, loaded, tiny_folder, tmp_path):
    url = run(loop, server.start(port=0))
    stream = client(url).chat.completions.create(
        model="tiny", messages=USER, max_tokens=400, extra_body={"min_tokens": 400}, stream=True
    )
    next(iter(stream))  # generating now
    other = tmp_path / "other"
    shutil.copytree(tiny_folder, other)
    loaded.load_model(other, "other")
    assert run(loop, loaded.wait_loaded())
    start = time.monotonic()
    with pytest.raises(openai.APIError, match="unloaded or replaced"):
        for _ in stream:
            pass
    assert time.monotonic() - start < 10
    assert [m.id for m in client(url).models.list().data] == ["other"]


def test_stop_cuts_an_open_stream_and_frees_its_pages(loop, server, loaded):
    url = run(loop, server.start(port=0))
    served = server._served
    stream = client(url).chat.completions.create(
        model="tiny", messages=USER, max_tokens=400, extra_body={"min_tokens": 400}, stream=True
    )
    next(iter(stream))  # the role chunk: the request's job is queued
    deadline = time.monotonic() + 10
    while not served.pages_in_use():
        assert time.monotonic() < deadline, "the request's job never started"
        time.sleep(0.005)
    start = time.monotonic()
    run(loop, server.stop())
    assert not server.is_running and server.url is None
    with pytest.raises((openai.APIError, openai.APIConnectionError)):
        for _ in stream:
            pass
    assert time.monotonic() - start < 10
    deadline = time.monotonic() + 10
    while served.pages_in_use():
        assert time.monotonic() < deadline, "the cut request's job still holds cache pages"
        time.sleep(0.01)
    assert store_running(server) is False


def test_a_port_in_use_says_so(loop, server):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match=f"Port {port} is in use"):
            run(loop, server.start(port=port))
        assert not server.is_running
    finally:
        taken.close()


def test_settings_persist_and_the_key_is_required(loop, store, loaded):
    srv = AppServer(store, loaded)
    url = run(loop, srv.start(port=0, api_key="sekrit"))
    try:
        assert "plain text" in srv.key_note  # no keyring here: the settings hold it, and the panel says so
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").models.list()
        assert [m.id for m in client(url, "sekrit").models.list().data] == ["tiny"]
    finally:
        srv.close()  # quitting: remembered as running
    again = AppServer(store, loaded)
    assert again.port == 0 and again.api_key() == "sekrit" and "plain text" in again.key_note
    task = again.restore()
    assert task is not None
    run(loop, task)
    assert again.is_running
    run(loop, again.stop())
    assert AppServer(store, loaded).restore() is None


def store_running(server: AppServer) -> bool:
    return server.store.get_setting("server.running")
