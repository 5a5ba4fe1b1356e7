"""Every failure of the inference app as an HTTP error, and the body guard in front of every route.

Every failure becomes an OpenAI/SGLang-style error body ({"error": {"message", "type", "param",
"code"}}) in one place, `error_response` (the mapping itself is the one all services share,
`bus.http.http_error`); a bad request never reaches the decode loop, so the engine keeps serving after
it. Malformed JSON and schema violations are 400 (FastAPI's 422 is remapped, as SGLang does). A 5xx
body never carries an exception's text: it gives an error id, and the log has the rest.

Before any route sees a body, `BodyGuard` refuses what would otherwise reach the JSON parser or the
tokenizer as a trap (`bus.http.parse_json_body`): a body over `max_body_bytes` (413), invalid UTF-8,
nesting deeper than `max_json_depth` (the parser would recurse until RecursionError), lone UTF-16
surrogates (which cannot be encoded back to UTF-8 in a log line, a tokenizer or a response) and
malformed JSON, each a 400 naming the problem. Numbers are left to the request models: the engine's
own checks name the offending token id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bus.http import BodyRefused, BodyTooLarge, http_error, parse_json_body, read_capped, refuse_declared_size
from schemas.inference.errors import InferenceError, InvalidRequestError, PayloadTooLargeError, WeightLoadError
from schemas.inference.protocol import ErrorBody, ErrorDetail

LOG_NAME = "the inference service's log"


def error_response(exc: Exception) -> JSONResponse:
    """The one mapping from an exception to an HTTP error response (SGLang's body: `code` is the status)."""
    error = http_error(exc, log_name=LOG_NAME)
    body: dict[str, Any] = ErrorBody(
        error=ErrorDetail(message=error.message, type=error.error_type, param=error.param, code=error.status)
    ).model_dump()
    if isinstance(exc, WeightLoadError):  # SGLang's /update_weights_from_disk failure keys, for its clients
        body.update(success=False, message=error.message, num_paused_requests=0)
    return JSONResponse(body, status_code=error.status, headers=dict(error.headers) or None)


def stream_error(exc: InferenceError) -> dict[str, Any]:
    """The last event of a stream whose request failed after its 200 was sent."""
    error = http_error(exc, log_name=LOG_NAME)
    return {"error": {"message": error.message, "type": error.error_type, "code": error.status}}


class _HungUp(Exception):
    """The caller went away before sending its whole body: there is no one to answer."""


class BodyGuard:
    """ASGI middleware: reads a request body once, refuses it (see the module doc), else replays it."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_json_depth: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        try:
            refuse_declared_size(dict(scope.get("headers") or []).get(b"content-length"), self.max_body_bytes)
            body = await read_capped(_chunks(receive), self.max_body_bytes)
            if body:
                parse_json_body(body, self.max_json_depth)
        except _HungUp:
            return
        except BodyRefused as e:
            refused = PayloadTooLargeError(str(e)) if isinstance(e, BodyTooLarge) else InvalidRequestError(str(e))
            await error_response(refused)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            raise _HungUp
        yield message.get("body", b"")
        more = message.get("more_body", False)
