"""What crosses to the views: the local engine's answers and a remote server's are the same AnswerChunks, each
with its token count (no token id tensors), its text, and that text split into thinking and answer once, by
the backend, as it streams."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import typing
from pathlib import Path

import pytest
import torch

from app.service import EngineService, GenerationSettings
from app.service.backend import EOS_KEYS, AnswerChunk
from app.service.reasoning import THINK, split
from app.service.remote import RemoteBackend

_spec = importlib.util.spec_from_file_location("chunk_remote_tests", Path(__file__).with_name("test_remote.py"))
_remote = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_remote)
raw_server, sse_head = _remote.raw_server, _remote.sse_head

CHAT = [{"role": "user", "content": "Colours?"}]
GREEDY = GenerationSettings.from_dict({"temperature": 1.0, "top_k": 1, "seed": 0, "max_new_tokens": 12})
DECLARED = typing.get_type_hints(AnswerChunk)


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, 60))


def check_chunks(chunks: list[AnswerChunk], job) -> None:
    """Every chunk has the declared keys only, all the required ones, and belongs to `job`; the last is eos."""
    for chunk in chunks:
        assert set(chunk) <= set(DECLARED), f"undeclared keys {set(chunk) - set(DECLARED)}"
        assert AnswerChunk.__required_keys__ <= set(chunk)
        assert chunk["stage"] == "streaming" and chunk["job"] is job and isinstance(chunk["num_tokens"], int)
    assert [c["eos"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert set(EOS_KEYS) - {"accepted_draft_tokens", "rejected_draft_tokens"} <= set(chunks[-1])


def joined(chunks: list[AnswerChunk], key: str) -> str:
    return "".join(c[key] for c in chunks)


def serve(loop, folder: Path, name: str) -> EngineService:
    svc = EngineService(dtype=torch.float32)
    svc.load_model(folder, name)
    assert run(loop, svc.wait_loaded())
    return svc


@pytest.fixture
def r1_folder(tmp_path, reasoning_models) -> Path:
    reasoning_models.tiny_qwen3(tmp_path, reasoning_models.R1_STYLE)  # the template opens the <think> block
    return tmp_path


def test_local_chunks_count_tokens_and_carry_the_engines_split(loop, tiny_folder, r1_folder):
    async def answer(svc):
        job = await svc.start_answer(CHAT, "", [], GREEDY, identifier="tab-1")
        return job, [c async for c in job]

    plain = serve(loop, tiny_folder, "tiny")
    try:
        job, chunks = run(loop, answer(plain))
    finally:
        run(loop, plain.close())
    check_chunks(chunks, job)
    eos = chunks[-1]
    assert all(c["identifier"] == "tab-1" for c in chunks)
    assert sum(c["num_tokens"] for c in chunks) == eos["new_tokens"] > 0
    assert joined(chunks, "text") == joined(chunks, "answer") == eos["full_completion"]
    assert not joined(chunks, "thinking")  # no reasoning format: all of it is answer

    thinker = serve(loop, r1_folder, "tiny-r1")
    try:
        job, chunks = run(loop, answer(thinker))
    finally:
        run(loop, thinker.close())
    check_chunks(chunks, job)
    eos = chunks[-1]
    assert sum(c["num_tokens"] for c in chunks) == eos["new_tokens"] > 0
    # The engine split it (its job had the model's reasoning format); the block was opened by the prompt.
    assert joined(chunks, "thinking").strip() == split(eos["full_completion"], THINK, inside=True)[0] != ""
    assert joined(chunks, "text") == eos["full_completion"]


def sse(delta: dict, finish: str | None = None) -> bytes:
    chunk = {"object": "chat.completion.chunk", "choices": [{"delta": delta, "finish_reason": finish}]}
    data = f"data: {json.dumps(chunk)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def streaming(*deltas: dict):
    async def handler(reader, writer, done):
        done_data = b"data: [DONE]\n\n"
        end = f"{len(done_data):x}\r\n".encode() + done_data + b"\r\n0\r\n\r\n"
        writer.write(sse_head() + b"".join(sse(d) for d in deltas) + sse({}, "stop") + end)
        await writer.drain()

    return handler


@pytest.mark.parametrize(
    "deltas",
    [
        # a server that leaves the tags in the content, split across deltas as tokens split them
        tuple({"content": c} for c in ("<th", "ink>plan ", "it</th", "ink>\n\nRed, ", "blue.")),
        # a server that sends the thinking apart
        ({"reasoning_content": "plan "}, {"reasoning_content": "it"}, {"content": "Red, "}, {"content": "blue."}),
    ],
    ids=["inline tags", "reasoning_content"],
)
def test_remote_chunks_are_split_once_as_they_stream(loop, deltas):
    async def answer():
        async with raw_server(streaming(*deltas)) as url:
            job = await RemoteBackend(url, model="m").start_answer(CHAT, "", [], GREEDY)
            return job, [c async for c in job]

    job, chunks = run(loop, answer())
    check_chunks(chunks, job)
    assert [c["num_tokens"] for c in chunks] == [1] * len(deltas) + [0]  # one token per delta
    assert (joined(chunks, "thinking"), joined(chunks, "answer")) == ("plan it", "Red, blue.")
    text = joined(chunks, "text")
    assert text == chunks[-1]["full_completion"] and split(text, THINK) == ("plan it", "Red, blue.")  # as stored
    assert not any("<" in c["thinking"] + c["answer"] for c in chunks)
