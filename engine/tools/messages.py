"""Chat messages with tool calls and tool results -> the messages a family's chat template renders.

The messages come in OpenAI's shape, arguments as JSON text:

    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                                            "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}]}
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}

A template that renders tools (`native`) gets transformers' shape: arguments as an object (templates write them with
`tojson`, the way the grammar made the model write them, so the next turn's prompt repeats the call's tokens and
reuses their cached pages), a tool message's function `name` filled in from the call it answers, and for Mistral
ids of the 9 letters and digits its templates insist on. A template that knows no tools gets them as text: the tool
definitions and the call syntax in the system message, calls in the family's syntax as the assistant's text, and
results as a user message of <tool_response> blocks (a user turn after an assistant turn, which any template takes).
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Mapping, Sequence
from typing import Any

from engine.tools.family import ToolFamily
from engine.tools.schema import Tool, ToolError

_ALPHANUMERIC = set(string.ascii_letters + string.digits)
_EXAMPLE_CALL = ("<function-name>", {"<argument>": "<value>"})


def template_messages(
    messages: Sequence[Mapping[str, Any]], family: ToolFamily, tools: Sequence[Tool] = (), param: str = "messages"
) -> list[dict[str, Any]]:
    """`messages` as `family`'s template takes them (see the module's docstring); for a template that knows no
    tools and a request with `tools`, their definitions join the system message (put first when there is none).
    Raises ToolError naming the field when a call's arguments are not a JSON object."""
    names = {
        call.get("id"): call.get("function", {}).get("name")
        for m in messages
        for call in (m.get("tool_calls") or ())
        if isinstance(call, Mapping)
    }
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"{param}[{i}]"
        calls = message.get("tool_calls") or ()
        if message.get("role") == "assistant" and calls:
            out.append(_assistant(message, _read_calls(calls, where), family))
        elif message.get("role") == "tool":
            _tool_result(out, message, names, family)
        else:
            out.append(dict(message))
    if tools and not family.native:
        _add_instructions(out, family, tools)
    return out


def tool_instructions(family: ToolFamily, tools: Sequence[Tool]) -> str:
    """What a model whose template knows no tools is told of them: their schemas and how to call one."""
    listed = "\n".join(json.dumps(t.definition(), ensure_ascii=False) for t in tools)
    example = family.render_calls([_EXAMPLE_CALL])
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query. You are provided with "
        f"function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\n"
        f"For each function call, answer with the function's name and arguments as JSON, like this:\n{example}"
    )


def _read_calls(calls: Any, where: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(id, name, arguments) of an assistant message's tool_calls."""
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}].function.arguments"
        function = call.get("function") or {}
        text = function.get("arguments")
        try:
            arguments = json.loads(text) if isinstance(text, str) and text.strip() else (text or {})
        except ValueError as e:
            raise ToolError(f"{at} is not JSON ({e}); send the arguments the call was made with.", at) from None
        if not isinstance(arguments, dict):
            raise ToolError(f"{at} must be a JSON object of the call's arguments.", at)
        out.append((str(call.get("id") or ""), str(function.get("name") or ""), arguments))
    return out


def _assistant(message: Mapping[str, Any], calls: list[tuple[str, str, dict]], family: ToolFamily) -> dict[str, Any]:
    content = message.get("content") or ""
    if not family.native:
        text = family.render_calls([(name, arguments) for _, name, arguments in calls])
        return {
            **message,
            "role": "assistant",
            "content": f"{content}\n{text}" if content else text,
            "tool_calls": None,
        }
    tool_calls = [
        {"id": _call_id(call_id, family), "type": "function", "function": {"name": name, "arguments": arguments}}
        for call_id, name, arguments in calls
    ]
    return {**message, "content": content, "tool_calls": tool_calls}


def _tool_result(out: list[dict[str, Any]], message: Mapping[str, Any], names: dict, family: ToolFamily) -> None:
    call_id = message.get("tool_call_id")
    name = message.get("name") or names.get(call_id)
    content = message.get("content")
    if family.native:
        result = {**message, "tool_call_id": _call_id(str(call_id or ""), family), "content": content}
        out.append({**result, "name": name} if name else result)
        return
    block = f"<tool_response>\n{content}\n</tool_response>"
    last = out[-1] if out else None
    if last is not None and last.get("role") == "user" and str(last.get("content", "")).endswith("</tool_response>"):
        last["content"] += "\n" + block  # results of one turn's calls in one user message
    else:
        out.append({"role": "user", "content": block})


def _add_instructions(out: list[dict[str, Any]], family: ToolFamily, tools: Sequence[Tool]) -> None:
    text = tool_instructions(family, tools)
    first = out[0] if out else None
    if first is not None and first.get("role") == "system" and isinstance(first.get("content"), str):
        out[0] = {**first, "content": f"{first['content']}\n\n{text}" if first["content"] else text}
    else:
        out.insert(0, {"role": "system", "content": text})


def _call_id(call_id: str, family: ToolFamily) -> str:
    """The id as the family's templates take it: Mistral's 9 letters and digits, the same for the call and for
    its result (the last 9 of its letters and digits, or a digest of it when it has fewer)."""
    if family.id_style != "mistral":
        return call_id
    kept = "".join(c for c in call_id if c in _ALPHANUMERIC)
    if len(kept) >= 9:
        return kept[-9:]
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]
