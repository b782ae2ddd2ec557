"""McpClient against real MCP servers written here with the SDK (MCPServer, once FastMCP) and run over stdio
as subprocesses: listing, a call, a server that hangs (the call's timeout gives an error result), a server that
exits mid-call, and one that cannot start. The client's loop thread is its own; these tests drive it from a
plain asyncio loop, as the service drives it from the GUI's."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from app.tools.loop_thread import LoopThread
from app.tools.mcp_client import McpClient, McpProblem, McpServerConfig

SERVER = textwrap.dedent(
    '''
    import os, sys, time
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("test-server")

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return f"{a} + {b} = {a + b}"

    @server.tool()
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}, 21 C" + os.environ.get("WEATHER_SUFFIX", "")

    @server.tool()
    def hang() -> str:
        """Never answers."""
        time.sleep(3600)
        return "never"

    @server.tool()
    def die() -> str:
        """Exits the server."""
        print("dying on purpose", file=sys.stderr, flush=True)
        os._exit(3)

    server.run("stdio")
    '''
)


@pytest.fixture(scope="module")
def thread():
    t = LoopThread("test-tools")
    yield t
    t.stop()


@pytest.fixture
def server_script(tmp_path) -> Path:
    path = tmp_path / "server.py"
    path.write_text(SERVER)
    return path


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def client(thread, script: Path, **kw) -> McpClient:
    config = McpServerConfig("test", command=sys.executable, args=(str(script),), **kw)
    return McpClient(config, thread)


def test_lists_and_calls_tools_over_stdio(thread, server_script):
    c = client(thread, server_script, env={"WEATHER_SUFFIX": " (from env)"})

    async def go():
        try:
            tools = await c.list_tools()
            add = await c.call_tool("add", {"a": 2, "b": 40})
            weather = await c.call_tool("weather", {"city": "Oslo"})
            bad = await c.call_tool("nope", {})
            return tools, add, weather, bad
        finally:
            await c.close()

    tools, add, weather, bad = run(go())
    by_name = {t.name: t for t in tools}
    assert set(by_name) == {"add", "weather", "hang", "die"}
    assert by_name["add"].description == "Add two integers." and by_name["add"].source == "test"
    definition = by_name["add"].definition()["function"]
    assert definition["parameters"]["properties"].keys() == {"a", "b"}
    assert add.text == "2 + 40 = 42" and not add.is_error
    assert weather.text == "Sunny in Oslo, 21 C (from env)"
    assert bad.is_error and "nope" in bad.text


def test_a_hanging_tool_times_out_as_an_error_result_and_the_session_stays_usable(thread, server_script):
    c = client(thread, server_script, call_timeout=1.5)

    async def go():
        try:
            hung = await c.call_tool("hang", {})
            after = await c.call_tool("add", {"a": 1, "b": 1})
            return hung, after
        finally:
            await c.close()

    hung, after = run(go())
    assert hung.is_error and "did not run hang within 1.5 s" in hung.text and "'test'" in hung.text
    assert after.text == "1 + 1 = 2"


def test_a_server_that_exits_gives_an_error_result_and_is_started_again(thread, server_script):
    c = client(thread, server_script, call_timeout=60)

    async def go():
        try:
            died = await c.call_tool("die", {})
            again = await c.call_tool("add", {"a": 3, "b": 4})
            return died, again
        finally:
            await c.close()

    died, again = run(go())
    assert died.is_error and "stopped while asked to run die" in died.text
    assert again.text == "3 + 4 = 7"


def test_a_server_that_cannot_start_or_never_answers_is_a_clear_error(thread, tmp_path):
    missing = McpClient(McpServerConfig("ghost", command=str(tmp_path / "no-such-server")), thread)
    silent_script = tmp_path / "silent.py"
    silent_script.write_text("import time\ntime.sleep(3600)\n")
    silent = client(thread, silent_script, start_timeout=1.5)
    crashing_script = tmp_path / "crash.py"
    crashing_script.write_text("import sys\nprint('no config file', file=sys.stderr)\nsys.exit(2)\n")
    crashing = client(thread, crashing_script)

    async def go():
        outcome = await missing.call_tool("x", {})
        with pytest.raises(McpProblem) as listing:
            await missing.list_tools()
        quiet = await silent.call_tool("x", {})
        crashed = await crashing.call_tool("x", {})
        for c in (missing, silent, crashing):
            await c.close()
        return outcome, str(listing.value), quiet, crashed

    outcome, listing, quiet, crashed = run(go())
    assert outcome.is_error and "'ghost'" in outcome.text and "could not start" in outcome.text
    assert "could not start" in listing
    assert quiet.is_error and "did not start within 1.5 s" in quiet.text
    assert crashed.is_error and "no config file" in crashed.text


def test_configs_check_their_fields_and_round_trip():
    with pytest.raises(ValueError, match="either a command"):
        McpServerConfig("both", command="x", url="http://h/mcp")
    with pytest.raises(ValueError, match="http"):
        McpServerConfig("web", url="ftp://h")
    config = McpServerConfig("web", url="https://example.invalid/mcp", call_timeout=5)
    assert McpServerConfig.from_dict(config.to_dict()) == config


HTTP_SERVER = textwrap.dedent(
    '''
    import sys
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("http-server")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text."""
        return "echo: " + text

    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]), streamable_http_path="/mcp")
    '''
)


def test_lists_and_calls_tools_over_streamable_http(thread, tmp_path):
    import socket
    import subprocess
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "http_server.py"
    script.write_text(HTTP_SERVER)
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen([sys.executable, str(script), str(port)], stderr=log, stdout=log)
    try:
        for _ in range(300):  # wait for the port (the server prints nothing we rely on)
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, (tmp_path / "server.log").read_text()
            time.sleep(0.1)
        c = McpClient(McpServerConfig("web", url=f"http://127.0.0.1:{port}/mcp", call_timeout=30), thread)

        async def go():
            try:
                return await c.list_tools(), await c.call_tool("echo", {"text": "hi"})
            finally:
                await c.close()

        tools, echoed = run(go())
    finally:
        process.terminate()
        process.wait(10)
        log.close()
    assert [t.name for t in tools] == ["echo"] and echoed.text == "echo: hi" and not echoed.is_error
