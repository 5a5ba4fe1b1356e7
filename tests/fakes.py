"""Fakes at true external edges only (docs/CONVENTIONS.md); each fake-backed test has a real-backed sibling.

`FailingEngine`: an SGLang-protocol server that answers every /generate with one HTTP error, as a
broken or buggy engine build can (SGLang answers 500 on internal errors). The native engine cannot be
made to do that on purpose, which is why this is a fake; the real-engine sibling of its test is the
4xx one (tests/adapter/test_adapter_limits.py).

`ScriptedChatModel`: an OpenAI Chat Completions server (an `httpx` transport) that answers each request
with the next scripted assistant message and keeps the request bodies, to read what an agent framework
sends, in a unit test's seconds. The real-backed sibling: the same agent through the capture proxy and the
native engine (tests/frameworks/test_openai_agents.py, and the reasoning-gym example's training run).
"""

from __future__ import annotations

import json
from typing import Any, cast

import httpx
import openai
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


class FailingEngine:
    """ASGI app: /generate answers `status` with an OpenAI-style error body; counts the requests."""

    def __init__(self, status: int = 500) -> None:
        self.status = status
        self.generate_requests = 0
        self.app = Starlette(routes=[Route("/generate", self._generate, methods=["POST"]),
                                     Route("/abort_request", self._abort, methods=["POST"])])

    async def _generate(self, request: Request) -> JSONResponse:
        await request.body()
        self.generate_requests += 1
        body: dict[str, Any] = {"error": {"message": "engine failure (fake)", "type": "internal_error"}}
        return JSONResponse(body, status_code=self.status)

    async def _abort(self, _: Request) -> JSONResponse:
        return JSONResponse({"num_aborted": 0})


class ScriptedChatModel:
    """`client()`: an `openai.AsyncOpenAI` whose request i is answered with `replies[i]` (an assistant
    message); `requests` holds the JSON bodies received."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = replies
        self.requests: list[dict[str, Any]] = []
        self.transport = httpx.MockTransport(self._answer)

    def client(self) -> openai.AsyncOpenAI:
        # the openai package types its client as its vendored httpx's; an `httpx.AsyncClient` works the same
        http = cast(Any, httpx.AsyncClient(transport=self.transport))
        return openai.AsyncOpenAI(base_url="http://scripted/v1", api_key="k", max_retries=0, http_client=http)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content))
        message = self.replies[len(self.requests) - 1]
        return httpx.Response(200, json={
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
