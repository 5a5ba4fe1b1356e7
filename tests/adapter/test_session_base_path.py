"""The per-session base path: `/sessions/{id}/v1/...` is `/v1/...` with `X-Session-Id: {id}`, on the call
routes the proxy serves ahead of FastAPI and on FastAPI's own routes alike."""

from __future__ import annotations

import pytest
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from fastapi.testclient import TestClient

from agents_adapter.proxy.asgi import ProxyApp, session_base_path

pytestmark = pytest.mark.unit


def seen(request: Request) -> dict[str, str | None]:
    return {"path": request.url.path, "session": request.headers.get("x-session-id")}


def app() -> ProxyApp:
    proxy = ProxyApp()

    async def fast(request: Request) -> Response:
        return JSONResponse(seen(request))

    proxy.fast_routes = {("POST", "/v1/chat/completions"): fast}

    @proxy.get("/v1/models")
    async def models(request: Request) -> dict[str, str | None]:
        return seen(request)

    return proxy


def test_the_session_in_the_path_is_the_calls_session() -> None:
    client = TestClient(app())
    assert client.post("/sessions/task-7.run-3/v1/chat/completions", json={}).json() == {
        "path": "/v1/chat/completions", "session": "task-7.run-3"}
    assert client.get("/sessions/s-1/v1/models").json() == {"path": "/v1/models", "session": "s-1"}
    # the path's session replaces a header's; without the prefix, the header is as sent
    replaced = client.post("/sessions/s-2/v1/chat/completions", headers={"X-Session-Id": "other"})
    assert replaced.json()["session"] == "s-2"
    assert client.post("/v1/chat/completions", headers={"X-Session-Id": "h-1"}).json() == {
        "path": "/v1/chat/completions", "session": "h-1"}


@pytest.mark.parametrize("path", ["/sessions//v1/chat/completions", "/sessions/s-1/chat/completions",
                                  "/sessions/s-1/v2/models", "/v1/sessions/s-1/end"])
def test_other_paths_are_left_as_they_are(path: str) -> None:
    scope = {"type": "http", "path": path, "headers": [(b"x-session-id", b"h")]}
    assert session_base_path(scope) is scope
