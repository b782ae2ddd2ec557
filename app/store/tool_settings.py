"""ToolSettings: what the user chose about tools. The MCP servers configured and the tools that run without
asking are app settings (JSON in the settings table); each chat's on/off switch per tool is a row of chat_tools
(migration 6), deleted with its chat.

Tools are named by their key, "<source>/<name>" (app.tools.spec.ToolSpec.key: "built-in/calculate",
"files/read_file"), so a switch survives a server being renamed for the model after a clash. Servers are kept
as plain dicts (app.tools.mcp_client.McpServerConfig.to_dict), so the store needs nothing from app.tools.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.store.db import Database
from app.store.settings import Settings

MCP_SERVERS_KEY = "mcp_servers"
ALWAYS_ALLOW_KEY = "tools_always_allow"


class ToolSettings:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._settings = Settings(db)

    # --- MCP servers --------------------------------------------------------------------------------------

    def servers(self) -> list[dict[str, Any]]:
        value = self._settings.get(MCP_SERVERS_KEY, [])
        return [dict(s) for s in value if isinstance(s, Mapping)] if isinstance(value, list) else []

    def set_servers(self, servers: Iterable[Mapping[str, Any]]) -> None:
        self._settings.set(MCP_SERVERS_KEY, [dict(s) for s in servers])

    # --- always allow -------------------------------------------------------------------------------------

    def always_allowed(self) -> set[str]:
        value = self._settings.get(ALWAYS_ALLOW_KEY, [])
        return {str(v) for v in value} if isinstance(value, list) else set()

    def set_always_allow(self, tool: str, on: bool) -> None:
        keys = self.always_allowed()
        keys = keys | {tool} if on else keys - {tool}
        self._settings.set(ALWAYS_ALLOW_KEY, sorted(keys))

    # --- per chat -----------------------------------------------------------------------------------------

    def chat_tools(self, chat_id: int) -> dict[str, bool]:
        """The chat's switches, {tool key: on}; a tool not listed is off."""
        rows = self._db.rows("SELECT tool, enabled FROM chat_tools WHERE chat_id = ?", (chat_id,))
        return {row[0]: bool(row[1]) for row in rows}

    def enabled(self, chat_id: int) -> set[str]:
        return {tool for tool, on in self.chat_tools(chat_id).items() if on}

    def set_chat_tool(self, chat_id: int, tool: str, on: bool) -> None:
        if not isinstance(tool, str) or not tool:
            raise ValueError(f"a tool key must be a non-empty string, got {tool!r}")
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO chat_tools (chat_id, tool, enabled) VALUES (?, ?, ?)"
                " ON CONFLICT (chat_id, tool) DO UPDATE SET enabled = excluded.enabled",
                (chat_id, tool, int(bool(on))),
            )
