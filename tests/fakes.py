"""Fakes at true external edges only (docs/CONVENTIONS.md); each fake-backed test has a real-backed sibling.

`FailingEngine`: an SGLang-protocol server that answers every /generate with one HTTP error, as a
broken or buggy engine build can (SGLang answers 500 on internal errors). The native engine cannot be
made to do that on purpose, which is why this is a fake; the real-engine sibling of its test is the
4xx one (tests/adapter/test_adapter_limits.py).
"""

from __future__ import annotations

from typing import Any

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
