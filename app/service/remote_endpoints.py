"""The remote endpoint the user chose (a vLLM, llama-server or Tandem server), kept across runs.

    store setting "remote_endpoint" = {"url", "model", "sees_images", "api_key" (only without a keyring)}
    API key -> the OS keyring when there is one (app.service.api_keys), else that setting, with a note the
    window shows.

`connect` turns what the user typed into a RemoteBackend whose model is chosen and whose context length is
known where the server says it: the first GET /models happens here, so a wrong URL or key is reported in the
dialog (or on the command line), not in the first chat answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from app.service.api_keys import KeyPlace, load_api_key, save_api_key
from app.service.remote import RemoteBackend

log = logging.getLogger(__name__)

SETTING_KEY = "remote_endpoint"


@dataclass(frozen=True)
class Endpoint:
    """A server to chat through: its API root (…/v1), the key (None: none), the model id (None: the first
    listed) and the user's word on whether that model reads images."""

    url: str
    api_key: str | None = None
    model: str | None = None
    sees_images: bool = False


async def connect(endpoint: Endpoint) -> tuple[RemoteBackend, list[str]]:
    """A RemoteBackend for `endpoint` and the models the server lists, after asking it (GET /models).
    Raises ValueError for a URL that is not http(s), RemoteError (a message saying what to do) when the
    server cannot be reached, refuses the key, or does not list the chosen model."""
    backend = RemoteBackend(endpoint.url, endpoint.api_key, endpoint.model, endpoint.sees_images)
    models = await backend.list_models()
    if endpoint.model is not None and endpoint.model not in models:
        from app.service.remote_errors import RemoteNotFound

        raise RemoteNotFound(
            f"The server at {backend.base_url} does not serve '{endpoint.model}'; it lists "
            f"{', '.join(models[:10])}. Pick one of those."
        )
    return backend, models


def save_endpoint(store: Any, endpoint: Endpoint) -> KeyPlace:
    """Remember `endpoint` for the next start; the key goes to the keyring, or (with the returned note) into
    the setting itself."""
    value: dict[str, Any] = {"url": endpoint.url, "model": endpoint.model, "sees_images": endpoint.sees_images}
    place = KeyPlace(True)
    if endpoint.api_key:
        place = save_api_key(endpoint.url, endpoint.api_key)
        if not place.in_keyring:
            value["api_key"] = endpoint.api_key
    store.set_setting(SETTING_KEY, value)
    return place


def saved_endpoint(store: Any) -> Endpoint | None:
    """The endpoint saved last, or None (never saved, or a damaged setting: ignored, never a crash)."""
    value = store.get_setting(SETTING_KEY)
    if not isinstance(value, dict) or not isinstance(value.get("url"), str):
        return None
    model = value.get("model")
    key = value.get("api_key") if isinstance(value.get("api_key"), str) else load_api_key(value["url"])
    return Endpoint(value["url"], key, model if isinstance(model, str) else None, value.get("sees_images") is True)


def describe(backend: RemoteBackend) -> str:
    """The window's line for a remote model, e.g. "Qwen2.5-7B at gpu-box:8000 · context 32768 tokens"."""
    host = backend.base_url.split("://", 1)[-1].split("/", 1)[0]
    context = f" · context {backend.context_length} tokens" if backend.context_length else ""
    return f"{backend.name} at {host}{context}"
