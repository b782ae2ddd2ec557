"""ToolBox: the tools one chat offers its model, and which of them run without asking.

The service's tool loop reads it: `definitions()` go to the model (the engine's `tools`, or a remote server's
`tools` field), `asks(name)` says whether a call waits for the user's approval, `run(name, arguments)` runs one.
It is made per answer from the registry and the store's switches (app.store.tool_settings), keyed by ToolSpec.key.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from app.tools.registry import ToolRegistry
from app.tools.spec import ToolOutcome, ToolSpec

# A result longer than this is cut (with a note saying so): it goes into the model's context whole.
MAX_RESULT_CHARS = 20_000


@dataclass(frozen=True)
class ToolBox:
    registry: ToolRegistry
    enabled: frozenset[str]  # ToolSpec keys switched on in this chat
    always_allow: frozenset[str] = frozenset()  # ToolSpec keys that run without asking

    @classmethod
    def of(cls, registry: ToolRegistry, enabled: Collection[str], always_allow: Collection[str] = ()) -> ToolBox:
        return cls(registry, frozenset(enabled), frozenset(always_allow))

    @property
    def specs(self) -> list[ToolSpec]:
        return [t for t in self.registry.tools if t.key in self.enabled]

    def definitions(self) -> list[dict[str, Any]]:
        """The OpenAI `tools` list of the chat's switched-on tools."""
        return [t.definition() for t in self.specs]

    def asks(self, name: str) -> bool:
        """Whether a call of `name` waits for the user's approval (all do, but those always allowed)."""
        spec = self.registry.tool(name)
        return spec is None or spec.key not in self.always_allow

    async def run(self, name: str, arguments: str | Mapping[str, Any]) -> ToolOutcome:
        spec = self.registry.tool(name)
        if spec is None or spec.key not in self.enabled:
            return ToolOutcome(f"The tool {name!r} is not switched on in this chat.", is_error=True)
        outcome = await self.registry.call(name, arguments)
        if len(outcome.text) <= MAX_RESULT_CHARS:
            return outcome
        cut = len(outcome.text) - MAX_RESULT_CHARS
        return ToolOutcome(f"{outcome.text[:MAX_RESULT_CHARS]}\n[... {cut} more characters cut]", outcome.is_error)
