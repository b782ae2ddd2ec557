"""The server over a generator someone else owns (as the app does): served per request from a function,
503 while it has no model, the generator left open when the server stops, 503 once its owner closes it."""

from __future__ import annotations

import asyncio
import threading
import time

import openai
import pytest
import torch

from engine import Cache, DynamicGeneratorAsync, DynamicJobAsync
from engine.chat_template import ChatTemplate
from engine.server.app import create_app
from engine.server.command import bind, make_server, url_of
from engine.server.served import ServedModel

USER = [{"role": "user", "content": "Hello"}]


class Serving:
    """A uvicorn server of `create_app(current)` on a thread with its own loop."""

    def __init__(self, current):
        self.server = make_server(create_app(current))
        self.sock = bind("127.0.0.1", 0)
        self.url = url_of(self.sock)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])))
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)


@pytest.fixture
def shared(tiny_model):
    cache = Cache(tiny_model, 1024, page_size=16)
    generator = DynamicGeneratorAsync(tiny_model, cache, tiny_model.tokenizer)
    served = ServedModel.shared(
        model=tiny_model,
        tokenizer=tiny_model.tokenizer,
        template=ChatTemplate.from_tokenizer(tiny_model.tokenizer),
        cache=cache,
        generator=generator,
        context=512,
        vision=None,
        name="owned-elsewhere",
    )
    yield served, generator
    asyncio.run(generator.close())


def test_no_model_then_the_shared_one_and_the_owner_keeps_its_generator(shared):
    served, generator = shared
    current: list[ServedModel | None] = [None]
    serving = Serving(lambda: current[0])
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client(serving.url).chat.completions.create(model="x", messages=USER, max_tokens=2)
        assert e.value.status_code == 503 and "No model is loaded" in str(e.value)

        current[0] = served
        c = client(serving.url)
        assert [m.id for m in c.models.list().data] == ["owned-elsewhere"]
        reply = c.chat.completions.create(model="owned-elsewhere", messages=USER, max_tokens=4)
        assert reply.usage.completion_tokens > 0 and served.context == 512
    finally:
        serving.stop()

    async def owners_job() -> list[dict]:  # the server's shutdown left the owner's generator running
        job = DynamicJobAsync(generator, torch.tensor([[1, 2, 3]]), 3)
        return [r async for r in job]

    assert asyncio.run(owners_job())[-1]["eos"]


def test_a_closed_shared_generator_answers_503(shared):
    served, generator = shared
    asyncio.run(generator.close())  # the owner swapped models
    serving = Serving(lambda: served)
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client(serving.url).chat.completions.create(model="owned-elsewhere", messages=USER, max_tokens=2)
        assert e.value.status_code == 503 and "unloaded or replaced" in str(e.value)
    finally:
        serving.stop()
