"""The service's tool loop with real parts: the tiny model (random weights) forced to call (tool_choice
"required") a tool of a real MCP server, written here with the SDK and run over stdio; the call waits for the
approval callback, runs (or is declined), its result goes back as a tool message, and the model answers."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap

import pytest
import torch

from app.service import EngineService, GenerationSettings
from app.service.tool_loop import DECLINED, ToolLoop, ToolStep
from app.tools.loop_thread import LoopThread
from app.tools.mcp_client import McpServerConfig
from app.tools.registry import ToolRegistry
from app.tools.toolbox import ToolBox

SERVER = textwrap.dedent(
    '''
    from typing import Literal
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("weather")
    ran = []

    @server.tool()
    def weather(city: Literal["Paris", "Rome", "Oslo"]) -> str:
        """The weather in a city."""
        return f"Sunny in {city}"

    server.run("stdio")
    '''
)
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = GenerationSettings.from_dict({"temperature": 1.0, "top_k": 1, "seed": 0, "max_new_tokens": 150})


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, 180))


@pytest.fixture(scope="module")
def service(qapp, tiny_folder):
    import qasync

    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    svc = EngineService(dtype=torch.float32)
    svc.load_model(tiny_folder, "tiny")
    assert run(loop, svc.wait_loaded())
    yield loop, svc
    run(loop, svc.close())
    asyncio.set_event_loop(None)
    loop.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    script = tmp_path_factory.mktemp("mcp") / "weather.py"
    script.write_text(SERVER)
    registry = ToolRegistry([McpServerConfig("weather", command=sys.executable, args=(str(script),))], LoopThread())
    yield registry
    asyncio.run(registry.close())


def loop_events(service, registry, approve, **kw):
    loop, svc = service

    async def go():
        assert await registry.refresh() == {}
        box = ToolBox.of(registry, {"weather/weather"}, kw.pop("always", ()))
        messages = [dict(m) for m in QUESTION]
        tool_loop = ToolLoop(svc, box, approve, choice="required", parallel=False, **kw)
        events = [e async for e in tool_loop.run(messages, "You answer briefly.", [], GREEDY)]
        return events, messages

    return run(loop, go())


def test_an_approved_call_runs_on_the_mcp_server_and_the_model_answers(service, registry):
    asked: list[ToolStep] = []

    async def approve(step):
        asked.append(step)
        await asyncio.sleep(0)  # the UI's answer comes later, from the event loop
        return True

    events, messages = loop_events(service, registry, approve, max_rounds=2)
    steps = [e for e in events if isinstance(e, ToolStep)]
    chunks = [e for e in events if not isinstance(e, ToolStep)]
    assert steps and len(steps) % 2 == 0 and len(asked) == len(steps) // 2
    for asked_step, done in zip(steps[::2], steps[1::2], strict=True):
        assert asked_step.outcome is None and asked_step.name == "weather"
        city = json.loads(asked_step.arguments)["city"]
        assert done.outcome.text == f"Sunny in {city}" and not done.outcome.is_error and not done.declined
    # round one ends with the calls, round two (the last allowed: tool_choice none) with an answer
    ends = [c for c in chunks if c["eos"]]
    assert len(ends) == 2 and ends[0]["tool_calls"] and "tool_calls" not in ends[1]
    assert [m["role"] for m in messages] == ["user", "assistant"] + ["tool"] * (len(steps) // 2)
    assert messages[1]["tool_calls"] == ends[0]["tool_calls"]
    assert messages[2]["content"].startswith("Sunny in ")


def test_a_declined_call_is_not_run_and_the_model_reads_that(service, registry):
    async def refuse(step):
        return False

    events, messages = loop_events(service, registry, refuse, max_rounds=2)
    done = [e for e in events if isinstance(e, ToolStep) and e.outcome is not None]
    assert done and all(s.declined and s.outcome.text == DECLINED for s in done)
    assert all(m["content"] == DECLINED for m in messages if m["role"] == "tool")
    assert sum(1 for e in events if not isinstance(e, ToolStep) and e["eos"]) == 2


def test_an_always_allowed_tool_runs_without_asking(service, registry):
    async def never(step):
        raise AssertionError("an always-allowed tool must not ask")

    events, _ = loop_events(service, registry, never, max_rounds=2, always={"weather/weather"})
    done = [e for e in events if isinstance(e, ToolStep) and e.outcome is not None]
    assert done and all(s.outcome.text.startswith("Sunny in ") for s in done)
