"""A remote thinking model: reasoning sent apart from the answer (`reasoning_content`, or newer vLLM's
`reasoning`) comes back between <think> tags, so the app shows and stores it as a local model's thinking.

Servers tried: Tandem's own serving a tiny random Qwen3 with an R1-style template (the template opens the
block, the server splits it off), and a raw server streaming vLLM-style `reasoning` deltas, one that ends
while still thinking, and one that sends no reasoning at all.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import openai

from app.service.generation import GenerationSettings
from app.service.reasoning import THINK, split
from app.service.remote import RemoteBackend
from engine import SamplerSettings
from engine.server.app import ServerOptions
from engine.server.served import ServedModel

_spec = importlib.util.spec_from_file_location("remote_tests", Path(__file__).with_name("test_remote.py"))
_remote = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_remote)
running, raw_server, sse_head = _remote.running, _remote.raw_server, _remote.sse_head

QUESTION = [{"role": "user", "content": "Colours?"}]


async def answer(url: str, model: str, max_new_tokens: int = 16) -> tuple[str, dict]:
    settings = GenerationSettings(SamplerSettings.greedy(), max_new_tokens=max_new_tokens)
    job = await RemoteBackend(url, model=model).start_answer(QUESTION, None, [], settings)
    results = [r async for r in job]
    return "".join(r["text"] for r in results), results[-1]


def test_reasoning_content_from_tandems_server_shows_as_thinking(tmp_path, reasoning_models):
    model = reasoning_models.tiny_qwen3(tmp_path, reasoning_models.R1_STYLE)
    served = ServedModel(model, "m", context=256, max_concurrent=2)
    with running(served, ServerOptions()) as url:
        reply = openai.OpenAI(base_url=url, api_key="none", max_retries=0).chat.completions.create(
            model="m", messages=QUESTION, temperature=0, max_tokens=16
        )
        text, last = asyncio.run(answer(url, "m"))
    reasoning = getattr(reply.choices[0].message, "reasoning_content", None)
    assert reasoning  # the template opened the block: 16 tokens of thinking at least begin
    assert text.startswith(THINK.start) and text == last["full_completion"]
    thinking, said = split(text, THINK)
    assert (thinking.strip(), said) == (reasoning.strip(), reply.choices[0].message.content or "")


def sse(delta: dict, finish: str | None = None) -> bytes:
    chunk = {"object": "chat.completion.chunk", "choices": [{"delta": delta, "finish_reason": finish}]}
    data = f"data: {json.dumps(chunk)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def streaming(*deltas: dict):
    async def handler(reader, writer, done):
        writer.write(sse_head() + b"".join(sse(d) for d in deltas) + sse({}, "stop"))
        writer.write(sse_end())
        await writer.drain()

    return handler


def sse_end() -> bytes:
    data = b"data: [DONE]\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"


def test_vllm_reasoning_deltas_are_tagged_and_plain_answers_are_left_alone():
    async def main():
        out = []
        for deltas in (
            ({"reasoning": "The user "}, {"reasoning": "wants colours."}, {"content": "Red, "}, {"content": "blue."}),
            ({"reasoning_content": "Still thinking"}, {"reasoning_content": " when cut"}),  # ended inside it
            ({"content": "Red, "}, {"content": "blue."}),  # no reasoning at all
            ({"role": "assistant", "content": None, "reasoning_content": None}, {"content": "ok"}),  # nulls
        ):
            async with raw_server(streaming(*deltas)) as url:
                out.append((await answer(url, "m"))[0])
        return out

    thought, cut, plain, nulls = asyncio.run(main())
    assert thought == "<think>The user wants colours.</think>Red, blue."
    assert split(thought, THINK) == ("The user wants colours.", "Red, blue.")
    assert cut == "<think>Still thinking when cut" and split(cut, THINK)[1] == ""
    assert plain == "Red, blue." and nulls == "ok"
