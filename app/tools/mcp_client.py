"""McpClient: one MCP server through the official SDK, stdio (a command) or streamable HTTP (a URL).

Each client keeps one session, owned by a runner task on the tools' LoopThread: the runner enters the transport
and the ClientSession, initialises, then waits until closed, so the SDK's task groups start and end in one task.
Callers on any loop await `list_tools()` and `call_tool()`; both hop to the thread.

Nothing a server does can hang the caller: starting is bounded by `start_timeout`, each call by `call_timeout`,
and a server that exits mid-call ends the call at once. Those failures come back as a ToolOutcome with
`is_error` (calls) or an McpProblem (listing) whose message names the server, says what happened, and adds the
last lines the server wrote to stderr. A session that died is started afresh by the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED

from app.tools.loop_thread import LoopThread
from app.tools.spec import ToolOutcome, ToolSpec

STDERR_TAIL_CHARS = 600


class McpProblem(RuntimeError):
    """A server that could not be reached, started or listed; the message says which and why."""


@dataclass(frozen=True)
class McpServerConfig:
    """A server as the user configured it: `command` (with `args` and extra `env`) for stdio, or `url` for
    streamable HTTP; exactly one of the two."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    start_timeout: float = 30.0
    call_timeout: float = 60.0

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("An MCP server needs a name.")
        if bool(self.command.strip()) == bool(self.url.strip()):
            raise ValueError(f"MCP server {self.name!r}: give either a command (stdio) or a URL (HTTP), not both.")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {self.name!r}: the URL must start with http:// or https://.")
        object.__setattr__(self, "args", tuple(str(a) for a in self.args))
        object.__setattr__(self, "env", {str(k): str(v) for k, v in dict(self.env).items()})

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": self.command,
            "args": list(self.args),
            "env": dict(self.env),
            "url": self.url,
            "start_timeout": self.start_timeout,
            "call_timeout": self.call_timeout,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> McpServerConfig:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    @property
    def where(self) -> str:
        return self.url or " ".join([self.command, *self.args])


class McpClient:
    """One configured server (see the module docstring)."""

    def __init__(self, config: McpServerConfig, thread: LoopThread) -> None:
        self.config = config
        self._thread = thread
        # touched only on the thread's loop
        self._runner: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[ClientSession] | None = None
        self._stop: asyncio.Event | None = None
        self._stderr: Any = None

    # --- from any loop --------------------------------------------------------------------------------------

    async def list_tools(self) -> list[ToolSpec]:
        """The server's tools, named as the server names them. Raises McpProblem."""
        return await self._thread.run(self._list_tools())

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolOutcome:
        """Run the server's tool `name`; every failure is an error outcome, never an exception or a hang."""
        return await self._thread.run(self._call_tool(name, dict(arguments)))

    async def close(self) -> None:
        await self._thread.run(self._close())

    # --- on the thread's loop -------------------------------------------------------------------------------

    async def _list_tools(self) -> list[ToolSpec]:
        session = await self._session()
        try:
            listed = await self._bounded(session.list_tools(), self.config.call_timeout, "list its tools")
        except McpProblem:
            raise
        except Exception as e:
            raise McpProblem(self._says(f"could not list its tools: {_reason(e)}")) from None
        return [
            ToolSpec(t.name, t.description or t.title or "", dict(t.input_schema or {}), source=self.config.name)
            for t in listed.tools
        ]

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        try:
            session = await self._session()
            result = await self._bounded(session.call_tool(name, arguments), self.config.call_timeout, f"run {name}")
        except McpProblem as e:
            return ToolOutcome(str(e), is_error=True)
        except Exception as e:
            return ToolOutcome(self._says(f"failed to run {name}: {_reason(e)}"), is_error=True)
        return _outcome(result)

    async def _bounded(self, request: Any, timeout: float, what: str) -> Any:
        """`request` awaited until it answers, `timeout` passes, or the session's runner ends (the server exited)."""
        call = asyncio.ensure_future(request)
        runner = self._runner
        waits = {call} if runner is None else {call, runner}
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if call in done:
            try:
                return call.result()
            except MCPError as e:
                if e.error.code != CONNECTION_CLOSED:
                    raise
                # The server left: end this session (the next request starts a new one) and say why.
                await self._close()
                raise McpProblem(self._says(f"stopped while asked to {what}{self._ended_because()}")) from None
        call.cancel()
        with contextlib.suppress(BaseException):
            await call
        if not done:
            raise McpProblem(
                self._says(f"did not {what} within {timeout:g} s; it may be stuck. Try again, or check the server.")
            )
        raise McpProblem(self._says(f"stopped while asked to {what}{self._ended_because()}"))

    async def _session(self) -> ClientSession:
        if self._runner is None or self._runner.done():
            loop = asyncio.get_running_loop()
            self._ready, self._stop = loop.create_future(), asyncio.Event()
            self._runner = loop.create_task(self._run(self._ready, self._stop))
        ready = self._ready
        try:
            return await asyncio.wait_for(asyncio.shield(ready), self.config.start_timeout)
        except asyncio.TimeoutError:
            await self._close()
            raise McpProblem(
                self._says(f"did not start within {self.config.start_timeout:g} s{self._stderr_tail()}")
            ) from None

    async def _run(self, ready: asyncio.Future[ClientSession], stop: asyncio.Event) -> None:
        # The server's stderr outlives the session, for the messages about why it ended.
        if self._stderr is not None:
            self._stderr.close()
        if not self.config.url:
            self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.config.url:
                    streams = await stack.enter_async_context(streamable_http_client(self.config.url))
                else:
                    params = StdioServerParameters(
                        command=self.config.command, args=list(self.config.args), env=dict(self.config.env) or None
                    )
                    streams = await stack.enter_async_context(stdio_client(params, errlog=self._stderr))
                read, write = streams[0], streams[1]
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                ready.set_result(session)
                await stop.wait()
        except BaseException as e:  # noqa: BLE001 - whatever ended the session is reported, not raised here
            if not ready.done():
                message = f"could not start ({_reason(e)}){self._stderr_tail()}"
                ready.set_exception(McpProblem(self._says(message)))
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            if not ready.done():
                ready.set_exception(McpProblem(self._says(f"closed before it started{self._stderr_tail()}")))

    async def _close(self) -> None:
        runner, stop = self._runner, self._stop
        if runner is None or runner.done():
            return
        if stop is not None:
            stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(runner), 5.0)
        except (asyncio.TimeoutError, Exception):
            runner.cancel()
            with contextlib.suppress(BaseException):
                await runner

    def _says(self, what: str) -> str:
        return f"The MCP server '{self.config.name}' ({self.config.where}) {what}"

    def _ended_because(self) -> str:
        tail = self._stderr_tail()
        return f": it exited or closed the connection{tail}" if tail else ": it exited or closed the connection."

    def _stderr_tail(self) -> str:
        if self._stderr is None or self._stderr.closed:
            return "."
        with contextlib.suppress(OSError, ValueError):
            self._stderr.flush()
            self._stderr.seek(0)
            text = self._stderr.read()[-STDERR_TAIL_CHARS:].strip()
            self._stderr.seek(0, 2)
            if text:
                return f". It wrote: {text}"
        return "."


def _outcome(result: Any) -> ToolOutcome:
    """A CallToolResult as text: its text parts joined, other parts named, the structured part as JSON."""
    parts: list[str] = []
    for item in getattr(result, "content", None) or []:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', 'content')} not shown]")
    if not parts and getattr(result, "structured_content", None) is not None:
        import json

        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return ToolOutcome("\n".join(parts), is_error=bool(getattr(result, "is_error", False)))


def _reason(e: BaseException) -> str:
    """The innermost cause of an exception (anyio wraps failures in groups)."""
    while getattr(e, "exceptions", None):  # an exception group
        e = e.exceptions[0]  # type: ignore[attr-defined]
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
