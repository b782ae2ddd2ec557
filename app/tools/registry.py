"""ToolRegistry: every tool the app can offer, the built-ins and each configured MCP server's, one name each.

    registry = ToolRegistry([McpServerConfig(...), ...])
    problems = await registry.refresh()        lists every server (their failures, by server name)
    registry.tools                             ToolSpecs: built-ins first, then each server's in order
    await registry.call(name, arguments_json)  a ToolOutcome; never raises for a tool's or server's failure
    await registry.close()                     ends the servers' sessions and the tools' thread

A model calls tools by name, so names must be unique: a server's tool whose name is taken is offered as
`<server>_<name>` (only letters, digits, _ and -, at most 64 characters, as OpenAI's API requires).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.tools.builtin import BUILTINS
from app.tools.loop_thread import LoopThread
from app.tools.mcp_client import McpClient, McpProblem, McpServerConfig
from app.tools.spec import BUILTIN, ToolOutcome, ToolSpec

MAX_NAME = 64


class ToolRegistry:
    def __init__(self, servers: Sequence[McpServerConfig] = (), thread: LoopThread | None = None) -> None:
        self._thread = thread
        self._clients: dict[str, McpClient] = {}
        self._listed: dict[str, list[ToolSpec]] = {}
        self._tools: dict[str, ToolSpec] = {}
        self.configure(servers)

    @property
    def servers(self) -> list[McpServerConfig]:
        return [c.config for c in self._clients.values()]

    @property
    def tools(self) -> list[ToolSpec]:
        return list(self._tools.values())

    def tool(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    def configure(self, servers: Sequence[McpServerConfig]) -> list[McpClient]:
        """Use `servers` from now on; returns the clients no longer used, for the caller to `close` (a server
        whose configuration is unchanged keeps its session). Their tools show after the next `refresh`."""
        names = [s.name for s in servers]
        if len(set(names)) != len(names):
            raise ValueError("Two MCP servers have the same name; give each its own.")
        old, self._clients = self._clients, {}
        for config in servers:
            kept = old.get(config.name)
            if kept is not None and kept.config == config:
                self._clients[config.name] = old.pop(config.name)
            else:
                self._clients[config.name] = McpClient(config, self._loop_thread())
                self._listed.pop(config.name, None)
        self._listed = {name: tools for name, tools in self._listed.items() if name in self._clients}
        self._rename()
        return list(old.values())

    async def refresh(self) -> dict[str, str]:
        """List every server's tools again; returns {server name: what went wrong} for those that failed (their
        tools are then not offered)."""
        problems: dict[str, str] = {}
        for name, client in self._clients.items():
            try:
                self._listed[name] = await client.list_tools()
            except McpProblem as e:
                self._listed.pop(name, None)
                problems[name] = str(e)
        self._rename()
        return problems

    async def call(self, name: str, arguments: str | Mapping[str, Any]) -> ToolOutcome:
        """Run the tool the model calls `name` with `arguments` (its JSON text, or a dict)."""
        spec = self._tools.get(name)
        if spec is None:
            return ToolOutcome(f"There is no tool named {name!r}.", is_error=True)
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                return ToolOutcome(f"The arguments are not valid JSON ({e.msg}).", is_error=True)
        if not isinstance(arguments, Mapping):
            return ToolOutcome("The arguments must be a JSON object.", is_error=True)
        if spec.source == BUILTIN:
            return BUILTINS[spec.tool_name][1](arguments)
        client = self._clients.get(spec.source)
        if client is None:
            return ToolOutcome(f"The MCP server '{spec.source}' is no longer configured.", is_error=True)
        return await client.call_tool(spec.tool_name, arguments)

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        if self._thread is not None:
            self._thread.stop()
            self._thread = None

    def _loop_thread(self) -> LoopThread:
        if self._thread is None:  # started with the first server: a registry of built-ins needs no thread
            self._thread = LoopThread()
        return self._thread

    def _rename(self) -> None:
        tools = {spec.name: spec for spec, _ in BUILTINS.values()}
        for server, listed in self._listed.items():
            for spec in listed:
                name = spec.tool_name
                if name in tools or not _valid(name):
                    name = _valid_name(f"{server}_{spec.tool_name}")
                    while name in tools:
                        name = _valid_name(name[: MAX_NAME - 1] + "_")
                tools[name] = ToolSpec(name, spec.description, spec.parameters, server, spec.tool_name)
        self._tools = tools


def _valid(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name))


def _valid_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[-MAX_NAME:] or "tool"
