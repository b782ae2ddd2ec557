"""Tool definitions and the tool choice, read from OpenAI's request shapes and checked once.

    tools=[{"type": "function", "function": {"name": "get_weather", "description": "...",
                                              "parameters": {"type": "object", "properties": {...}}}}]
    tool_choice="auto" | "none" | "required" | {"type": "function", "function": {"name": "get_weather"}}

Every refusal is a ToolError naming the field that is wrong (`param`, e.g. "tools[1].function.name"), so an API
answers it with a 400 and the app shows it as it is. A tool's parameters must be a JSON schema of an object, and
one llguidance can compile: a call's arguments are held to it while they are generated (engine.tools.grammar).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# OpenAI's rule for function names; it also keeps names safe inside every family's call syntax (a harmony
# recipient ends at a space, a Mistral name at [ARGS]).
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
MODES = ("none", "auto", "required")
# How generated JSON is spelled: compact, with the separators of json.dumps and of templates' `tojson`, so that a
# call rendered back into the next turn's prompt is the text the model wrote (and its cached pages are reused).
# `lenient`: schema keywords llguidance cannot enforce (formats, say) are let through rather than refused.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


class ToolError(ValueError):
    """A tool definition, tool choice or tool message that cannot be used; `param` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tool:
    """One function the model may call: its name, what it does, and the JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(EMPTY_PARAMETERS))

    def definition(self) -> dict[str, Any]:
        """The OpenAI shape chat templates take in `tools` (the one transformers documents)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = json.loads(json.dumps(self.parameters))  # a plain copy the template may read
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """How the answer may use the tools: `none` (never), `auto` (text or calls), `required` (one call or more),
    or `function` (a call of the tool `name`)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def calls(self) -> bool:
        """Whether the answer may hold calls at all."""
        return self.mode != "none"

    @property
    def forced(self) -> bool:
        """Whether the answer must be calls (and nothing else)."""
        return self.mode in ("required", "function")


def read_tools(raw: Any, param: str = "tools") -> tuple[Tool, ...]:
    """The tools of an OpenAI `tools` list (None or [] for none); ToolError naming the field otherwise."""
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise ToolError(f'{param} must be a list of {{"type": "function", "function": {{...}}}} objects.', param)
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        tools.append(_tool(item, f"{param}[{i}]"))
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            where = f"{param}[{i}].function.name"
            raise ToolError(f"{where}: the function {tool.name!r} is named twice; give each tool its own name.", where)
        seen.add(tool.name)
    return tuple(tools)


def read_tool_choice(raw: Any, tools: Sequence[Tool], param: str = "tool_choice") -> ToolChoice:
    """The choice of an OpenAI `tool_choice` (None: `auto` with tools, `none` without); it may only name one of
    `tools`, and only ask for calls when there are tools."""
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(raw, str):
        if raw not in MODES:
            raise ToolError(
                f"{param} must be 'none', 'auto', 'required' or "
                f'{{"type": "function", "function": {{"name": ...}}}}; got {raw!r}.',
                param,
            )
        if raw == "required" and not tools:
            raise ToolError(f"{param} is 'required' but the request has no tools; send tools to call.", param)
        return ToolChoice(raw)
    function = raw.get("function") if isinstance(raw, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(raw, Mapping) or raw.get("type") != "function" or not isinstance(name, str):
        raise ToolError(f'{param} as an object must be {{"type": "function", "function": {{"name": ...}}}}.', param)
    if name not in {t.name for t in tools}:
        known = ", ".join(t.name for t in tools) or "none"
        raise ToolError(
            f"{param} names the function {name!r}, which is not among the tools (they are: {known}).", param
        )
    return ToolChoice("function", name)


def _tool(item: Any, where: str) -> Tool:
    if not isinstance(item, Mapping) or item.get("type", "function") != "function":
        raise ToolError(f'{where} must be {{"type": "function", "function": {{"name": ..., ...}}}}.', where)
    function = item.get("function")
    if not isinstance(function, Mapping):
        raise ToolError(f'{where}.function must be an object with "name", "description" and "parameters".', where)
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ToolError(f"{where}.function.name is missing: every tool needs a name.", f"{where}.function.name")
    if not NAME.fullmatch(name):
        raise ToolError(
            f"{where}.function.name {name!r} must be 1 to 64 letters, digits, underscores or dashes.",
            f"{where}.function.name",
        )
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise ToolError(f"{where}.function.description must be a string.", f"{where}.function.description")
    parameters = function.get("parameters")
    return Tool(name, description, _parameters(parameters, f"{where}.function.parameters"))


def _parameters(schema: Any, where: str) -> dict[str, Any]:
    if schema is None:
        return dict(EMPTY_PARAMETERS)
    if not isinstance(schema, Mapping):
        raise ToolError(f"{where} must be a JSON schema object, got {type(schema).__name__}.", where)
    kind = schema.get("type", "object")
    if kind != "object":
        raise ToolError(
            f'{where} must describe an object (a call\'s arguments are named): "type" must be "object", got {kind!r}.',
            where,
        )
    try:
        plain = json.loads(json.dumps(schema))  # a copy of plain JSON values
    except (TypeError, ValueError) as e:
        raise ToolError(f"{where} is not JSON: {e}", where) from None
    problem = check_schema(plain)
    if problem:
        raise ToolError(f"{where} is not a JSON schema that arguments can be held to: {problem}", where)
    return plain


def with_options(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` with JSON_OPTIONS, in the form llguidance reads them (its "x-guidance" key)."""
    return {**schema, "x-guidance": JSON_OPTIONS}


def check_schema(schema: Mapping[str, Any]) -> str | None:
    """Why llguidance cannot hold JSON to `schema`, or None when it can."""
    import llguidance  # imported on first use, as the generator's filters do

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(with_options(schema))
    except (ValueError, TypeError) as e:
        return str(e)
    error = llguidance.LLMatcher.validate_grammar(grammar)
    return error.strip() if error and not error.startswith("WARNING") else None
