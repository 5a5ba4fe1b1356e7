"""The capture proxy's ASGI entry: the one error function, and the call routes served ahead of FastAPI.

`error_response` turns every failure into OpenAI's error body; `ProxyApp` is the FastAPI app with the
call routes (`FAST_ROUTES`) dispatched by (method, path) before Starlette's middleware and routing.

A per-session base path, for agents that cannot send the `X-Session-Id` header: `/sessions/{id}/v1/...`
is served as `/v1/...` with `X-Session-Id: {id}` (the path's id replaces a header the request carries),
so an agent's base URL `<proxy>/sessions/{id}/v1` puts every call it makes in that session, as other
gateways' per-session routes do (`session_base_path`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from agents_adapter.errors import ProxyError
from bus.http import http_error


def error_response(exc: BaseException) -> Response:
    """An exception as OpenAI's error body (the status and fields: `bus.http.http_error`, shared)."""
    error = http_error(exc, log_name="the proxy's log")
    body = {"error": {"message": error.message, "type": error.error_type, "param": error.param, "code": error.code}}
    # A conflict is final here (an ended session, an end that differs from the first): openai clients
    # would otherwise retry a 409 as a lock timeout.
    headers = {"x-should-retry": "false"} if error.status == 409 else {}
    headers |= error.headers
    # ensure_ascii: a message quoting the request (a lone surrogate, say) must still encode
    return Response(json.dumps(body), status_code=error.status, headers=headers, media_type="application/json")


_SESSION_PATH = re.compile(r"/sessions/([^/]+)(/v1/.*)")


def session_base_path(scope: Any) -> Any:
    """An HTTP scope under `/sessions/{id}/v1/` as the scope of its `/v1/` path with `X-Session-Id: {id}`
    (the same scope when the path has no session prefix)."""
    match = _SESSION_PATH.fullmatch(scope.get("path", "")) if scope["type"] == "http" else None
    if match is None:
        return scope
    session, path = match.groups()
    headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"x-session-id"]
    return scope | {"path": path, "raw_path": path.encode("utf-8"),
                    "headers": [*headers, (b"x-session-id", session.encode("utf-8"))]}


#: The call routes, served ahead of FastAPI's routing and middleware (`ProxyApp`).
FAST_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/generate", "/v1/responses", "/v1/messages")


class ProxyApp(FastAPI):
    """FastAPI with the call routes taken straight to their endpoint functions.

    Starlette's middleware stack, route matching and FastAPI's request handling cost about a third of
    a millisecond of CPU per call (bench/adapter_bench.py's profile) for endpoints that take the bare
    `Request` and return a `Response`: the call routes are looked up by (method, path) here instead,
    and their failures go through the same `error_response` as the app's exception handlers (an
    exception that is no `ProxyError` or HTTP error is raised again once answered, as Starlette's
    `ServerErrorMiddleware` does, for the server's log). Every other request, and the OpenAPI document,
    which still lists these routes, are FastAPI's."""

    fast_routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        scope = session_base_path(scope)
        endpoint = self.fast_routes.get((scope.get("method", ""), scope.get("path", ""))) if (
            scope["type"] == "http" and not scope.get("root_path")) else None
        if endpoint is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        unexpected: Exception | None = None
        try:
            response = await endpoint(Request(scope, receive, send))
        except Exception as exc:
            response = error_response(exc)
            if not isinstance(exc, ProxyError | RequestValidationError | StarletteHTTPException):
                unexpected = exc
        await response(scope, receive, send)
        if unexpected is not None:
            raise unexpected
