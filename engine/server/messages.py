"""OpenAI chat messages -> the messages a chat template renders, and the images they carry (as bytes).

    {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}]}
    ->  {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image"}]}  + [png bytes]

An assistant message's `tool_calls` and a `tool` message's result are checked for shape and kept in OpenAI's form
(arguments as JSON text); engine.tools.messages turns them into what the model's template takes.

Images come only as data: URLs: fetching http(s) URLs would make the server a client of any host a
request names, and would stall a job on someone else's network.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.server.errors import bad_request

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


@dataclass
class ChatInput:
    messages: list[dict[str, Any]]
    images: list[bytes] = field(default_factory=list)  # in the order their image parts appear


def read_messages(raw: list[Any]) -> ChatInput:
    out = ChatInput([])
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise bad_request(f"{where} must be an object with role and content.", where)
        role = message.get("role")
        if role == "function" or message.get("function_call"):
            raise bad_request(
                f"{where}: function messages and function_call are OpenAI's retired names; send tool_calls and "
                "tool messages.",
                where,
            )
        if role not in _ROLES:
            raise bad_request(
                f"{where}.role must be one of system, developer, user, assistant, tool; got {role!r}.", where
            )
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""
        read = {"role": _ROLES[role], "content": _content(content, role, where, out.images)}
        if role == "assistant" and message.get("tool_calls"):
            read["tool_calls"] = _tool_calls(message["tool_calls"], where)
        elif role == "tool":
            read.update(_tool_result(message, where))
        out.messages.append(read)
    return out


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_request(f"{where}.tool_calls must be a list of calls.", f"{where}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise bad_request(
                f'{at} must be {{"id": ..., "type": "function", "function": {{"name": ..., "arguments": "{{...}}"}}}}.',
                at,
            )
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise bad_request(f"{at}.function.arguments must be the arguments' JSON text.", f"{at}.function.arguments")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise bad_request(f"{at}.id must be a string.", f"{at}.id")
        out.append(
            {
                "id": call_id or f"call_{j}",
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return out


def _tool_result(message: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(
            f"{where}: a tool message needs tool_call_id, the id of the call it answers.", f"{where}.tool_call_id"
        )
    name = message.get("name")
    return {"tool_call_id": call_id, **({"name": name} if isinstance(name, str) and name else {})}


def _content(content: Any, role: str, where: str, images: list[bytes]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of content parts.", f"{where}.content")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url" and role == "user":
            images.append(_data_url(part.get("image_url"), f"{at}.image_url"))
            parts.append({"type": "image"})
        elif kind == "image_url":
            raise bad_request(f"{at}: only user messages may hold images.", at)
        else:
            raise bad_request(f"{at} must be a text part or (in user messages) an image_url part, got {kind!r}.", at)
    if all(p["type"] == "text" for p in parts):
        # Text-model templates print string content; OpenAI reads text parts as one text.
        return "\n".join(p["text"] for p in parts)
    return parts


def _data_url(value: Any, where: str) -> bytes:
    url = value.get("url") if isinstance(value, Mapping) else value
    if not isinstance(url, str):
        raise bad_request(f'{where} must be {{"url": "data:image/...;base64,..."}}.', where)
    if url.startswith(("http://", "https://")):
        raise bad_request(
            f"{where}: only data: URLs are accepted for images (data:image/png;base64,...); this server does "
            "not fetch http(s) URLs. Download the image and send its bytes inline.",
            where,
            code="image_url_not_supported",
        )
    head, comma, data = url.partition(",")
    if not url.startswith("data:") or not comma or not head.endswith(";base64"):
        raise bad_request(f"{where}: an image must be a base64 data: URL (data:image/png;base64,...).", where)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}: the data: URL's base64 is not valid.", where) from None
