"""What can go wrong talking to a remote OpenAI-compatible server, each as an exception whose message says
what happened and what to do. The chat shows the message under the partial answer, which it keeps.

    RemoteError                 every failure of a remote backend (catch this one)
      RemoteUnreachable         nothing listens at the URL (refused, unknown host, no route)
      RemoteTimeout             no answer, or no next piece of the stream, within the timeout
      RemoteAuthError           401/403: the API key is missing or wrong
      RemoteNotFound            404: unknown model, or a base URL that is not the API's
      RemoteStreamCut           the connection ended before the answer did
      RemoteBadReply            the reply is not OpenAI-shaped (an HTML page, not JSON, no choices)
      RemoteRefused             any other error status, with the server's own message

`context_exceeded` tells a refusal for length (prompt + max_tokens past the model's context) from the rest, and
`stated_context` reads the context the refusal names, for the chat's overflow policy (app.service.remote_overflow).
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx2


class RemoteError(RuntimeError):
    """A remote server could not give the answer; str(error) is the message for the user."""


class RemoteUnreachable(RemoteError):
    pass


class RemoteTimeout(RemoteError):
    pass


class RemoteAuthError(RemoteError):
    pass


class RemoteNotFound(RemoteError):
    pass


class RemoteStreamCut(RemoteError):
    pass


class RemoteBadReply(RemoteError):
    pass


class RemoteRefused(RemoteError):
    def __init__(self, message: str, status: int, server_message: str):
        super().__init__(message)
        self.status = status
        self.server_message = server_message


def transport_error(error: httpx2.TransportError, base_url: str, timeout: float, received: int) -> RemoteError:
    """The RemoteError for a failure below HTTP; `received` is how many characters of answer had arrived."""
    kept = f" The {received} characters received so far are kept." if received else ""
    if isinstance(error, httpx2.ConnectTimeout):
        return RemoteTimeout(
            f"The server at {base_url} did not accept a connection within {timeout:g} s. Check the URL and that the "
            "server is running and reachable from this machine (a firewall may drop the connection)."
        )
    if isinstance(error, httpx2.TimeoutException):
        return RemoteTimeout(
            f"The server at {base_url} sent nothing for {timeout:g} s.{kept} It may be overloaded or stuck; try "
            "again, or raise the endpoint's timeout if its answers are slow to start."
        )
    if isinstance(error, httpx2.ConnectError):
        return RemoteUnreachable(
            f"Cannot reach {base_url} ({_reason(error)}). Check that the server is running and that the host and "
            "port in the URL are right."
        )
    if isinstance(error, (httpx2.RemoteProtocolError, httpx2.ReadError)) and received:
        return stream_cut(base_url, received, _reason(error))
    if isinstance(error, (httpx2.RemoteProtocolError, httpx2.ReadError)):
        return RemoteStreamCut(
            f"The server at {base_url} closed the connection without a complete reply ({_reason(error)}). Check "
            "the server's log: it may have crashed or restarted. Then try again."
        )
    return RemoteUnreachable(f"Talking to {base_url} failed ({_reason(error)}). Check the URL and the network.")


def stream_cut(base_url: str, received: int, reason: str = "the stream ended early") -> RemoteStreamCut:
    return RemoteStreamCut(
        f"The answer from {base_url} was cut off after {received} characters ({reason}); what arrived is kept. The "
        "server may have crashed, restarted or dropped the connection: check its log and try again."
    )


def status_error(status: int, body: bytes, url: str, model: str | None) -> RemoteError:
    """The RemoteError for an HTTP error reply; `url` is the request's, `model` the model asked for."""
    said = server_message(body)
    quoted = f' The server said: "{said}"' if said else ""
    names_model = model is not None and (
        _error_code(body) == "model_not_found" or any(f"{q}{model}{q}" in said for q in "'\"`")
    )
    if status in (401, 403):
        return RemoteAuthError(
            f"The server at {url} refused the API key ({status}).{quoted} Enter the key the server was started "
            "with (for example its --api-key) in the endpoint's settings."
        )
    if status == 404 and names_model:
        return RemoteNotFound(
            f"The server does not know the model '{model}' (404).{quoted} Pick one of the models it lists."
        )
    if status == 404:
        return RemoteNotFound(
            f"Nothing answers at {url} (404).{quoted} Check the base URL: for most servers it ends in /v1, for "
            "example http://host:8000/v1."
        )
    return RemoteRefused(f"The server at {url} answered {status}.{quoted or ' It gave no reason.'}", status, said)


def context_exceeded(error: RemoteRefused) -> bool:
    """A 400 saying prompt + max_tokens is past the model's context, in the words vLLM, llama-server and
    Tandem's server use (the code, or the message)."""
    said = error.server_message.lower()
    return error.status == 400 and (
        "context_length_exceeded" in said or "context length" in said or "context size" in said
    )


# vLLM: "maximum context length is 4096 tokens", llama-server: "the available context size (4096 tokens)",
# Tandem: "maximum context length is 4096 tokens (--context)": the first count of tokens after "context".
_STATED_CONTEXT = re.compile(r"context[^.\d]{0,40}?(\d+) tokens", re.IGNORECASE)


def stated_context(error: RemoteRefused) -> int:
    """The model's context in tokens as a refusal for length states it; 0 when it names none."""
    found = _STATED_CONTEXT.search(error.server_message)
    return int(found.group(1)) if found else 0


def not_openai(url: str, content_type: str, body: bytes) -> RemoteBadReply:
    snippet = _snippet(body.decode("utf-8", "replace"))
    return RemoteBadReply(
        f"The server at {url} did not answer like an OpenAI-compatible API (it sent {content_type or 'no type'}: "
        f'"{snippet}"). Check the base URL: it should be the API\'s, usually ending in /v1.'
    )


def server_message(body: bytes) -> str:
    """The server's own words in an error body: OpenAI's error.message, FastAPI's detail, or the text."""
    text = body.decode("utf-8", "replace")
    try:
        data: Any = json.loads(text)
    except ValueError:
        return _snippet(text)
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        for value in (error, data.get("detail"), data.get("message")):
            if isinstance(value, str):
                return value
            if value is not None:
                return _snippet(json.dumps(value))
    return _snippet(text)


def _error_code(body: bytes) -> str | None:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


def _snippet(text: str, limit: int = 160) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(error: BaseException) -> str:
    return str(error) or type(error).__name__
