"""OpenAI's error replies: `{"error": {"message", "type", "param", "code"}}` with the status code that fits.

Routes raise APIError; the handlers below turn it, Starlette's own HTTP errors (unknown path, wrong method)
and anything unexpected into that JSON, so every client sees one error shape.
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """A request the server answers with an error; `message` says what was wrong and what to do."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"There is no {request.url.path}; this server offers /v1/models, /v1/chat/completions, /v1/completions and /health."
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}."
    else:
        message = str(exc.detail)
    return APIError(exc.status_code, message).response()


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return APIError(500, f"The server failed on this request ({type(exc).__name__}: {exc}).").response()


EXCEPTION_HANDLERS = {APIError: _api_error, HTTPException: _http_error, Exception: _unexpected}
