"""A remote chat longer than the remote model's context, answered as its overflow policy says: our own
`engine.server` (the starter, 256 tokens of context, refusing what does not fit) in a thread of this process,
once as it is and once behind a path where its model card does not say its context; llama.cpp's
llama-server (its /tokenize) when it can be found."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
from starlette.responses import JSONResponse

from app.service.generation import GenerationSettings
from app.service.remote import RemoteBackend
from app.service.remote_errors import RemoteError, RemoteRefused, stated_context
from app.service.remote_overflow import estimate_tokens
from engine import SamplerSettings
from engine.models import Model
from engine.server.app import create_app
from engine.server.command import bind, make_server, url_of
from engine.server.served import ServedModel

CONTEXT = 256
HIDDEN = "/hidden"  # under this path our server's model card leaves out its context (max_model_len)
REFIT = "past the context; asking again"  # what the job logs when a refusal for length drops more turns


def settings(**changes) -> GenerationSettings:
    return GenerationSettings(SamplerSettings.greedy(), max_new_tokens=16).replace(**changes)


def long_chat(num_exchanges: int, repeat: int = 1) -> list[dict]:
    """A chat of `num_exchanges` questions and answers (each said `repeat` times) and a last question: 21
    messages are about 460 of the starter's tokens."""
    chat = []
    for i in range(1, num_exchanges + 1):
        question = f"Question {i}: name a colour that goes well with a spring sky. "
        chat.append({"role": "user", "content": (question * repeat).strip()})
        answer = f"Answer {i}: a soft yellow goes well with it, like sunlight. "
        chat.append({"role": "assistant", "content": (answer * repeat).strip()})
    return [*chat, {"role": "user", "content": "Which colour did you name first?"}]


CHAT = long_chat(10)


def hiding_context(app):
    """Our server's app, which under HIDDEN lists its model without max_model_len (as `transformers serve` and
    hosted APIs do) and is otherwise itself."""

    async def asgi(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(HIDDEN + "/"):
            path = scope["path"].removeprefix(HIDDEN)
            if path == "/v1/models":
                card = {"object": "list", "data": [{"id": "starter", "object": "model", "owned_by": "tandem"}]}
                await JSONResponse(card)(scope, receive, send)
                return
            scope = {**scope, "path": path, "raw_path": path.encode()}
        await app(scope, receive, send)

    return asgi


@contextmanager
def running(app):
    """An ASGI app on a free port of 127.0.0.1, in a thread; yields its root URL."""
    server = make_server(app)
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), name="test-uvicorn")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield url_of(sock).removesuffix("/v1")
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def ours(starter_gguf):
    """Root URL of our server on the starter: CONTEXT tokens, and a 400 for a chat that does not fit."""
    served = ServedModel(Model.load(starter_gguf), "starter", context=CONTEXT, max_concurrent=2)
    with running(hiding_context(create_app(served))) as root:
        yield root


async def collect(job) -> list[dict]:
    return [chunk async for chunk in job]


def reference(base_url: str, messages: list[dict]):
    """Our server's own greedy answer to `messages`, asked directly."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    return client.chat.completions.create(model="starter", messages=messages, temperature=0, max_tokens=16)


@pytest.mark.parametrize("policy", ["truncate-middle", "rolling-window"])
def test_a_chat_past_the_context_is_answered_from_the_turns_the_policy_keeps(ours, policy, caplog):
    url = f"{ours}/v1"
    backend = RemoteBackend(url, model="starter")

    async def main():
        job = await backend.start_answer(CHAT, "", [], settings(overflow=policy))
        first_seen = job.first_seen  # known when the answer starts, as the chat reads it
        return job, first_seen, await collect(job)

    with caplog.at_level(logging.INFO, logger="app.service"):
        job, first_seen, chunks = asyncio.run(main())
    head = CHAT[:2] if policy == "truncate-middle" else []
    assert first_seen is not None and len(head) < first_seen < len(CHAT) - 1 and job.first_seen == first_seen
    assert CHAT[first_seen]["role"] == "user"  # the model's view resumes at a question
    assert backend.context_length == CONTEXT
    # Fitted before sending (a conservative estimate: our server has no /tokenize), so never refused.
    assert REFIT not in caplog.text and "counts estimate" in caplog.text
    # The server was sent the head and the kept turns: its own answer to those is the same, token for token.
    same = reference(url, head + CHAT[first_seen:])
    last = chunks[-1]
    assert last["eos"] and last["full_completion"] == same.choices[0].message.content != ""
    assert last["prompt_tokens"] == same.usage.prompt_tokens
    assert last["prompt_tokens"] + last["new_tokens"] <= CONTEXT


def test_stop_shows_the_servers_refusal(ours):
    backend = RemoteBackend(f"{ours}/v1", model="starter")

    async def main():
        job = await backend.start_answer(CHAT, "", [], settings(overflow="stop"))
        text = ""
        with pytest.raises(RemoteError) as caught:
            async for chunk in job:
                text += chunk["text"]
        return job, text, caught.value

    job, text, error = asyncio.run(main())
    assert text == "" and job.first_seen is None
    assert isinstance(error, RemoteRefused) and error.status == 400
    assert f"maximum context length is {CONTEXT} tokens" in str(error)


def test_an_unknown_context_is_learned_from_the_refusal(ours, caplog):
    url = f"{ours}{HIDDEN}/v1"
    backend = RemoteBackend(url, model="starter")

    async def main():
        await backend.list_models()
        assert backend.context_length == 0
        job = await backend.start_answer(CHAT, "", [], settings(overflow="truncate-middle"))
        assert job.first_seen is None  # nothing to fit to yet: the whole chat goes first
        chunks = await collect(job)
        again = await backend.start_answer(CHAT, "", [], settings(overflow="truncate-middle"))
        again_chunks = await collect(again)
        # What a backend told the context by the model card keeps of the same chat.
        fitted = await RemoteBackend(f"{ours}/v1", model="starter").start_answer(
            CHAT, "", [], settings(overflow="truncate-middle")
        )
        await fitted.cancel()
        return job, chunks, again, again_chunks, fitted.first_seen

    with caplog.at_level(logging.INFO, logger="app.service"):
        job, chunks, again, again_chunks, fitted_first_seen = asyncio.run(main())
    # Refused once: the refusal said the context, and the next answer was fitted to it before it was sent.
    assert caplog.text.count(REFIT) == 1 and backend.context_length == CONTEXT
    assert job.first_seen == again.first_seen == fitted_first_seen is not None
    assert chunks[-1]["eos"] and chunks[-1]["full_completion"] == again_chunks[-1]["full_completion"] != ""


@pytest.fixture(scope="module")
def tiny_server(tiny_folder):
    """Root URL of our server on the tiny model, whose 320-token vocabulary takes two or three times the
    tokens the estimate expects of English."""
    served = ServedModel(Model.load(tiny_folder), "tiny", context=CONTEXT, max_concurrent=2)
    with running(create_app(served)) as root:
        yield root


def test_a_count_that_was_short_drops_one_more_block_per_refusal(tiny_server, caplog):
    backend = RemoteBackend(f"{tiny_server}/v1", model="tiny")
    chat = long_chat(5, repeat=3)

    async def main():
        job = await backend.start_answer(chat, "", [], settings(overflow="rolling-window", max_new_tokens=4))
        planned = job.first_seen
        return job, planned, await collect(job)

    with caplog.at_level(logging.INFO, logger="app.service"):
        job, planned, chunks = asyncio.run(main())
    num_refits = caplog.text.count(REFIT)
    assert num_refits >= 1 and backend.context_length == CONTEXT  # the refusal named the context known already
    assert planned is not None and job.first_seen > planned and chat[job.first_seen]["role"] == "user"
    assert chunks[-1]["eos"] and chunks[-1]["prompt_tokens"] + chunks[-1]["new_tokens"] <= CONTEXT


def test_refusals_for_length_name_the_context_in_each_servers_words():
    said = {
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.": 4096,  # vLLM
        "request (331 tokens) exceeds the available context size (256 tokens), try increasing it": 256,  # llama
        "This model's maximum context length is 1024 tokens (--context). The prompt has 2000 tokens.": 1024,
        "context_length_exceeded": 0,
    }
    for message, context in said.items():
        assert stated_context(RemoteRefused("", 400, message)) == context
    # Conservative for English (the starter: 4.8 characters a token), digits and other scripts.
    assert estimate_tokens("The river runs through the old town.") >= 12
    assert estimate_tokens("2024") == 4 and estimate_tokens("今天") == 6


# ------------------------------------------------------------------------------------------- llama-server


def find_llama_server() -> Path | None:
    for candidate in (
        os.environ.get("LLAMA_SERVER"),
        os.environ.get("LLAMA_CPP_LIB_PATH") and str(Path(os.environ["LLAMA_CPP_LIB_PATH"]) / "llama-server"),
        shutil.which("llama-server"),
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="module")
def llama_server(starter_gguf, tmp_path_factory):
    """Base URL of llama-server on the starter GGUF, 512 tokens of context, one slot; skips without it."""
    binary = find_llama_server()
    if binary is None:
        pytest.skip("llama-server is not on PATH and neither $LLAMA_SERVER nor $LLAMA_CPP_LIB_PATH names it")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    libraries = os.pathsep.join(filter(None, [str(binary.parent), os.environ.get("LD_LIBRARY_PATH")]))
    command = [str(binary), "-m", str(starter_gguf), "--port", str(port), "-c", "512", "-np", "1", "-t", "1"]
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*command, "--no-webui"], env={**os.environ, "LD_LIBRARY_PATH": libraries}, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"llama-server exited: {log.read_text()[-600:]}"
            assert time.monotonic() < deadline, f"llama-server did not start: {log.read_text()[-600:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(20)


def test_llama_server_counts_with_its_own_tokenizer(llama_server, caplog):
    backend = RemoteBackend(llama_server)
    chat = long_chat(16)  # about 700 tokens

    async def main():
        job = await backend.start_answer(chat, "", [], settings(overflow="truncate-middle"))
        return job, await collect(job)

    with caplog.at_level(logging.INFO, logger="app.service"):
        job, chunks = asyncio.run(main())
    assert backend.context_length == 512 and "counts llama-server" in caplog.text and REFIT not in caplog.text
    assert job.first_seen is not None and chat[job.first_seen]["role"] == "user"
    assert chunks[-1]["eos"] and 256 < chunks[-1]["prompt_tokens"] + chunks[-1]["new_tokens"] <= 512
