"""OpenAI chat messages -> the messages a chat template renders, and the images they carry (as bytes).

    {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}]}
    ->  {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image"}]}  + [png bytes]

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

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


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
        if role in ("tool", "function") or message.get("tool_calls") or message.get("function_call"):
            raise bad_request(f"{where}: tool calls and tool results are not supported by this server.", where)
        if role not in _ROLES:
            raise bad_request(f"{where}.role must be one of system, developer, user, assistant; got {role!r}.", where)
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""
        out.messages.append({"role": _ROLES[role], "content": _content(content, role, where, out.images)})
    return out


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
