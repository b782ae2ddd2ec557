"""The Backend seam: the local engine and the remote client are both Backends, and the local start_answer
does what the chat did (prompt off the GUI thread, the answer capped by the room left, a full context refused)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from app.service import EngineService, GenerationSettings
from app.service.backend import AnswerJob, Backend, ContextFull
from app.service.remote import RemoteBackend

CHAT = [{"role": "user", "content": "The quick brown fox"}]
GREEDY = GenerationSettings.from_dict({"temperature": 1.0, "top_k": 1, "top_p": 0.0, "seed": 0, "max_new_tokens": 6})


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, 60))


@pytest.fixture
def local(loop, tiny_folder):
    svc = EngineService(dtype=torch.float32)
    svc.load_model(tiny_folder, "tiny")
    assert run(loop, svc.wait_loaded())
    yield svc
    run(loop, svc.close())


def test_the_local_engine_and_a_remote_server_are_backends(local):
    assert isinstance(local, Backend) and isinstance(RemoteBackend("http://127.0.0.1:9/v1"), Backend)
    assert local.name == "tiny" and local.is_loaded and local.context_length > 0 and not local.can_see_images


def test_start_answer_streams_what_start_job_gives_for_the_same_prompt(loop, local):
    encoded_on: list[int] = []
    answering = local.local_backend  # EngineService answers through its LocalBackend
    encode, build = answering.encode_chat, answering.prompt  # start_answer builds through `prompt`

    def spy(*args):
        encoded_on.append(threading.get_ident())
        return build(*args)

    answering.prompt = spy

    async def answer():
        job = await local.start_answer(CHAT, "Be brief.", [], GREEDY, identifier="tab-1")
        assert isinstance(job, AnswerJob)
        return [r async for r in job]

    results = run(loop, answer())
    assert encoded_on and threading.get_ident() not in encoded_on  # the template ran off the calling thread
    answering.prompt = build
    ids = encode(CHAT, "Be brief.")

    async def direct():
        job = local.start_job(ids, GREEDY.sampler(), max_new_tokens=6, seed=0)
        return [r async for r in job]

    eos, direct_eos = results[-1], run(loop, direct())[-1]
    assert eos["eos"] and eos["full_completion"] == direct_eos["full_completion"] and eos["new_tokens"] == 6
    assert eos["prompt_tokens"] == local.count_tokens(CHAT, "Be brief.") == ids.shape[-1]


def test_the_answer_is_capped_by_the_room_left_and_a_full_context_refused(loop, local):
    room = local.context_length - local.count_tokens(CHAT)

    async def answer(settings):
        return [r async for r in await local.start_answer(CHAT, "", [], settings)]

    eos = run(loop, answer(GREEDY.replace(max_new_tokens=room + 50, top_k=1)))[-1]
    assert eos["new_tokens"] <= room
    long_chat = [{"role": "user", "content": "fox " * local.context_length}]
    with pytest.raises(ContextFull, match="fills the model's context of"):
        run(loop, local.start_answer(long_chat, "", [], GREEDY))
