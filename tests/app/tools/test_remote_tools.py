"""The remote backend in the tool loop: the tools go out in the API's `tools` field, the streamed
delta.tool_calls come back as the round's calls, and the next request carries the assistant's calls and the
tool results as OpenAI messages. The server is a plain asyncio HTTP server scripted here; the tool is a
built-in (exact arithmetic), always allowed."""

from __future__ import annotations

import asyncio
import json
import re

from app.service import GenerationSettings
from app.service.remote import RemoteBackend
from app.service.tool_loop import ToolLoop, ToolStep
from app.tools.registry import ToolRegistry
from app.tools.toolbox import ToolBox

MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
GREEDY = GenerationSettings.from_dict({"temperature": 0.0, "seed": 0, "max_new_tokens": 64})


def event(delta: dict, finish: str | None = None) -> bytes:
    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    data = f"data: {json.dumps(chunk)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


CALL = [
    event(
        {
            "role": "assistant",
            "tool_calls": [
                {"index": 0, "id": "call_a", "type": "function", "function": {"name": "calculate", "arguments": ""}}
            ],
        }
    ),
    event({"tool_calls": [{"index": 0, "function": {"arguments": '{"expression": '}}]}),
    event({"tool_calls": [{"index": 0, "function": {"arguments": '"0.1 + 0.2"}'}}]}),
    event({}, "tool_calls"),
]
ANSWER = [event({"content": "It is "}), event({"content": "0.3."}), event({}, "stop")]


async def scripted_server(replies: list[list[bytes]], bodies: list[dict]):
    async def serve(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
            body = await reader.readexactly(int(length.group(1)) if length else 0)
            if head.startswith(b"GET /v1/models"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
            else:
                bodies.append(json.loads(body))
                done_data = b"data: [DONE]\n\n"
                done = f"{len(done_data):x}\r\n".encode() + done_data + b"\r\n0\r\n\r\n"
                head_out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                writer.write(head_out + b"".join(replies.pop(0)) + done)
            await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


def test_the_remote_backend_sends_tools_and_reads_streamed_calls():
    bodies: list[dict] = []

    async def go():
        server = await scripted_server([CALL, ANSWER], bodies)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        try:
            registry = ToolRegistry()
            box = ToolBox.of(registry, {"built-in/calculate"}, {"built-in/calculate"})

            async def never(step):
                raise AssertionError("always allowed")

            messages = [{"role": "user", "content": "0.1 + 0.2?"}]
            events = [
                e async for e in ToolLoop(RemoteBackend(url, model="m"), box, never).run(messages, "", [], GREEDY)
            ]
            return events, messages
        finally:
            server.close()
            await server.wait_closed()

    events, messages = asyncio.run(asyncio.wait_for(go(), 60))
    first, second = bodies
    assert [t["function"]["name"] for t in first["tools"]] == ["calculate"]
    assert first["tool_choice"] == "auto" and first["parallel_tool_calls"] is True
    done = [e for e in events if isinstance(e, ToolStep) and e.outcome is not None]
    assert [(s.call_id, s.outcome.text) for s in done] == [("call_a", "0.1 + 0.2 = 0.3")]
    call = {
        "id": "call_a",
        "type": "function",
        "function": {"name": "calculate", "arguments": '{"expression": "0.1 + 0.2"}'},
    }
    assert second["messages"][-2:] == [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "0.1 + 0.2 = 0.3", "tool_call_id": "call_a"},
    ]
    answer = "".join(e["answer"] for e in events if not isinstance(e, ToolStep))
    assert answer == "It is 0.3." and messages[-1]["role"] == "tool"
