"""ToolSpec: one tool as a model sees it (an OpenAI function definition), and ToolOutcome: what a call gave."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

BUILTIN = "built-in"  # the `source` of the app's own tools; an MCP tool's is its server's name


@dataclass(frozen=True)
class ToolSpec:
    """A tool under the `name` the model calls it by; `tool_name` is its name at its `source` (they differ when
    two servers offer tools of the same name). `parameters` is its JSON schema."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    source: str = BUILTIN
    tool_name: str = ""

    def __post_init__(self) -> None:
        if not self.tool_name:
            object.__setattr__(self, "tool_name", self.name)

    @property
    def key(self) -> str:
        """What the store keeps per tool (on/off per chat, always allow): its source and its own name, which
        stay the same when a clash renames it for the model."""
        return f"{self.source}/{self.tool_name}"

    def definition(self) -> dict[str, Any]:
        """The OpenAI `tools` entry: what the engine's templates and remote servers read."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }


@dataclass(frozen=True)
class ToolOutcome:
    """A call's result as the model reads it (`text`), and whether it failed (`is_error`; the text says why)."""

    text: str
    is_error: bool = False
