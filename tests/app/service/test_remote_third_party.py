"""RemoteBackend against servers that are not ours, each started by the test as a subprocess on a free port:

- `transformers serve` (from transformers[serving], a test dependency) on a tiny random Llama folder;
- llama.cpp's `llama-server` on the starter GGUF, when `$LLAMA_SERVER`, `$LLAMA_CPP_LIB_PATH` or PATH has it
  (`../shared/tools/build-llama-cpp.sh` builds it). Each test skips, naming what is missing, when its server
  cannot be started.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from app.service.generation import GenerationSettings
from app.service.remote import RemoteBackend
from engine import SamplerSettings

USER = [{"role": "user", "content": "Name three colours."}]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def settings(**changes) -> GenerationSettings:
    """Greedy settings, 16 tokens at most, with `changes` (sampler fields or job fields)."""
    return GenerationSettings(SamplerSettings.greedy(), max_new_tokens=16).replace(**changes)


async def answer(backend: RemoteBackend, messages=USER, **changes):
    job = await backend.start_answer(messages, None, [], settings(**changes))
    return job, [result async for result in job]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(command: list[str], env: dict, ready_url: str, log: Path, seconds: float) -> subprocess.Popen:
    """Start a server subprocess and wait until `ready_url` answers 200; skips naming what failed."""
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.skip(f"{command[0]} exited with {process.returncode}: {log.read_text()[-600:]}")
        try:
            with urllib.request.urlopen(ready_url, timeout=1) as response:
                if response.status == 200:
                    return process
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    stop(process)
    pytest.skip(f"{command[0]} did not answer {ready_url} within {seconds:g} s: {log.read_text()[-600:]}")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(20)


# ------------------------------------------------------------------------------------- transformers serve


@pytest.fixture(scope="module")
def transformers_serve(tiny_folder, tmp_path_factory):
    """(base URL, model id) of `transformers serve` on a copy of the tiny random Llama with a ChatML template."""
    try:
        import fastapi  # noqa: F401  transformers serve needs transformers[serving]
        import uvicorn  # noqa: F401
    except ImportError as e:
        pytest.skip(f"transformers serve needs transformers[serving] (pip install -e '.[test]'): {e}")
    command = shutil.which("transformers", path=str(Path(sys.executable).parent)) or shutil.which("transformers")
    if command is None:
        pytest.skip("no `transformers` command next to this Python or on PATH")
    folder = tmp_path_factory.mktemp("served") / "tiny-llama"
    shutil.copytree(tiny_folder, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    process = start_server(
        [command, "serve", "--port", str(port), "--device", "cpu", str(folder)],
        env,
        f"http://127.0.0.1:{port}/health",
        folder.parent / "serve.log",
        60,
    )
    try:
        yield f"http://127.0.0.1:{port}/v1", str(folder)
    finally:
        stop(process)


def test_transformers_serve_streams_its_own_greedy_answer(transformers_serve):
    url, model_id = transformers_serve
    reference = openai.OpenAI(base_url=url, api_key="none", max_retries=0).chat.completions.create(
        model=model_id, messages=USER, temperature=0, max_tokens=16
    )
    backend = RemoteBackend(url)

    async def main():
        models = await backend.list_models()
        return models, await answer(backend)

    models, (_, results) = asyncio.run(main())
    assert models == [model_id] and backend.model == model_id
    *chunks, last = results
    assert "".join(r["text"] for r in chunks) == last["full_completion"] == reference.choices[0].message.content
    assert last["new_tokens"] == reference.usage.completion_tokens and last["prompt_tokens"] > 0
    assert last["eos_reason"] == {"stop": "stop_token", "length": "max_new_tokens"}[reference.choices[0].finish_reason]


def test_transformers_serve_refuses_extra_sampler_fields_and_is_asked_again_without(transformers_serve):
    url, model_id = transformers_serve
    backend = RemoteBackend(url, model=model_id)
    sampled = dict(temperature=0.8, top_k=40, min_p=0.05, token_repetition_penalty=1.1, seed=3)

    async def main():
        return await answer(backend, **sampled), await answer(backend, **sampled)

    (first, first_results), (again, again_results) = asyncio.run(main())
    # It answers 422 naming top_k, min_p and repetition_penalty; the job asks again without them, and the
    # backend leaves them out from then on.
    assert set(first.dropped_fields) == {"top_k", "min_p", "repetition_penalty"} and again.dropped_fields == ()
    assert first_results[-1]["eos"] and again_results[-1]["eos"] and first_results[-1]["new_tokens"] > 0


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
    """Base URL of llama.cpp's llama-server on the starter GGUF, 1024 tokens of context, one slot."""
    binary = find_llama_server()
    if binary is None:
        pytest.skip("llama-server is not on PATH and neither $LLAMA_SERVER nor $LLAMA_CPP_LIB_PATH names it")
    port = free_port()
    # Its shared libraries (libllama, libggml) sit beside it in a llama.cpp build folder.
    libraries = os.pathsep.join(filter(None, [str(binary.parent), os.environ.get("LD_LIBRARY_PATH")]))
    # One thread: llama.cpp's threads spin while they wait for each other, which stalls on a busy 2-core machine.
    command = [str(binary), "-m", str(starter_gguf), "--port", str(port), "-c", "1024", "-np", "1", "-t", "1"]
    process = start_server(
        [*command, "--no-webui"],
        {**os.environ, "LD_LIBRARY_PATH": libraries},
        f"http://127.0.0.1:{port}/health",
        tmp_path_factory.mktemp("llama-server") / "server.log",
        60,
    )
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop(process)


def test_llama_server_streams_answers_with_its_context_and_cache(llama_server):
    backend = RemoteBackend(llama_server)

    async def main():
        first = await answer(backend, max_new_tokens=24)  # lists the models first
        return first, await answer(backend, max_new_tokens=24)

    (_, first), (_, again) = asyncio.run(main())
    assert backend.model.endswith(".gguf") and backend.context_length == 1024  # its model card's meta.n_ctx
    assert backend.request_body(USER, settings(token_repetition_penalty=1.1))["repeat_penalty"] == 1.1
    text = "".join(r["text"] for r in first[:-1])
    assert text and text == first[-1]["full_completion"] == again[-1]["full_completion"]
    assert first[-1]["new_tokens"] <= 24 and first[-1]["prompt_tokens"] > 10
    assert again[-1]["cached_tokens"] > 0  # the same prompt again: llama-server reuses its slot's cache


def busy_slots(base_url: str) -> int:
    """How many of llama-server's slots are generating now (its GET /slots)."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/slots", timeout=5) as response:
        return sum(slot["is_processing"] for slot in json.load(response))


def test_llama_server_stops_when_the_stream_is_closed(llama_server):
    backend = RemoteBackend(llama_server)
    count = [{"role": "user", "content": "Count from 1 to 500, one number per line."}]

    async def main():
        job = await backend.start_answer(count, "", [], settings(max_new_tokens=900))
        async for _ in job:
            if job.is_running:  # the first piece (results already queued still come after the cancel)
                assert busy_slots(llama_server) == 1
                assert await job.cancel()
        # 900 tokens would keep the slot busy for seconds; closing the stream frees it at the next token.
        deadline = time.monotonic() + 2
        while busy_slots(llama_server):
            assert time.monotonic() < deadline, "llama-server still generates the cancelled answer"
            await asyncio.sleep(0.02)
        return (await answer(backend, max_new_tokens=4))[1]

    assert asyncio.run(main())[-1]["eos"]
