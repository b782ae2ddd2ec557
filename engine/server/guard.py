"""What a request passes before it reaches the model: the API key, the body's size, the body being JSON."""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.requests import Request

from engine.server.errors import APIError, bad_request

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024  # room for a few base64 images


def check_api_key(request: Request, api_key: str | None) -> None:
    """401 unless the request carries `Authorization: Bearer <api_key>` (when the server has a key)."""
    if api_key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise APIError(
            401,
            "This server needs an API key: send it as 'Authorization: Bearer KEY' (the openai client's api_key).",
            code="invalid_api_key",
        )
    # Constant-time, so response timing says nothing about how much of a guess was right.
    if not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        raise APIError(
            401, "Incorrect API key provided; use the key the server was started with.", code="invalid_api_key"
        )


async def read_json(request: Request, max_bytes: int) -> Any:
    """The body as JSON; 413 past `max_bytes` (checked before and while reading, never reading it all)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise _too_large(max_bytes)
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad_request(f"The request body is not valid JSON ({e}).") from None


def _too_large(max_bytes: int) -> APIError:
    return APIError(
        413,
        f"The request body is larger than this server takes ({max_bytes} bytes, --max-body-mb). Send smaller or "
        "fewer images.",
        code="request_too_large",
    )
