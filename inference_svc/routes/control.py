"""Control endpoints (pause, continue, abort, weight loads, cache flush), SGLang's shapes.

They require the control key when one is configured (`InferenceConfig.control_key`: without a key the
service binds to loopback only); `create_app` puts `control_key_check` on the whole router. Each call
runs off the event loop: the engine answers at its next token boundary.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import APIRouter, Security
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from inference_svc.config import InferenceConfig
from inference_svc.engine import NativeEngine
from schemas.inference.errors import UnauthorizedError
from schemas.inference.protocol import (
    AbortRequest,
    AbortResponse,
    ContinueGenerationRequest,
    ControlResponse,
    PauseGenerationRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDiskResponse,
)


def control_router(engine: NativeEngine) -> APIRouter:
    router = APIRouter()

    @router.post("/pause_generation")
    async def pause_generation(req: PauseGenerationRequest) -> ControlResponse:
        held = await asyncio.to_thread(engine.pause, req.mode)
        return ControlResponse(message="Generation paused successfully.", num_requests=held)

    @router.post("/continue_generation")
    async def continue_generation(req: ContinueGenerationRequest | None = None) -> ControlResponse:
        await asyncio.to_thread(engine.resume)
        return ControlResponse(message="Generation continued successfully.")

    @router.post("/abort_request")
    async def abort_request(req: AbortRequest) -> AbortResponse:
        if req.abort_all:
            return AbortResponse(num_aborted=await asyncio.to_thread(engine.abort_all))
        return AbortResponse(num_aborted=int(await asyncio.to_thread(engine.abort, req.rid)))

    @router.post("/update_weights_from_disk")
    async def update_weights_from_disk(req: UpdateWeightsFromDiskRequest) -> UpdateWeightsFromDiskResponse:
        if req.keep_pause:
            await asyncio.to_thread(engine.pause, "in_place")
        result = await asyncio.to_thread(
            engine.update_weights_from_disk, req.model_path, req.version(), abort_all_requests=req.abort_all_requests,
            sha256=req.sha256,
        )
        return UpdateWeightsFromDiskResponse(
            success=result.success,
            message=result.message,
            num_paused_requests=result.num_paused_requests,
            weight_version=str(result.weight_version),
            load_ms=result.load_ms,
            apply_ms=result.apply_ms,
        )

    @router.get("/flush_cache", operation_id="flush_cache_get")
    @router.post("/flush_cache", operation_id="flush_cache")
    async def flush_cache() -> Response:
        flushed = engine.flush_cache()
        return Response("Cache flushed.\n" if flushed else "Cache not flushed.\n", status_code=200 if flushed else 400)

    return router


def control_key_check(config: InferenceConfig) -> Any:
    """The dependency that guards control endpoints: `Authorization: Bearer <control_key>`."""
    assert config.control_key is not None
    expected = config.control_key.get_secret_value().encode("utf-8")
    bearer = HTTPBearer(auto_error=False, description="the control key (InferenceConfig.control_key)")

    async def check(credentials: HTTPAuthorizationCredentials | None = Security(bearer)) -> None:
        given = b"" if credentials is None else credentials.credentials.encode("latin-1", "replace")
        if not hmac.compare_digest(given, expected):
            raise UnauthorizedError("this control endpoint needs the control key: send Authorization: Bearer <key>")

    return check
