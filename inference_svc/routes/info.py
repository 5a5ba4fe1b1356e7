"""What the service serves and how it is doing: weight version, model info, engine stats, health.

Open to every caller (no control key): the proxy and the launcher read them to route and supervise.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from inference_svc.config import InferenceConfig
from inference_svc.engine import NativeEngine
from schemas.inference.errors import InferenceError
from schemas.inference.protocol import ModelInfoResponse, WeightVersionResponse
from schemas.inference.types import SamplingOptions

HEALTH_TIMEOUT_S = 20.0


def info_router(engine: NativeEngine, config: InferenceConfig, has_tokenizer: bool) -> APIRouter:
    router = APIRouter()

    @router.get("/get_weight_version")
    @router.get("/weight_version")
    async def get_weight_version() -> WeightVersionResponse:
        return WeightVersionResponse(weight_version=str(engine.weight_version))

    @router.get("/get_model_info")
    @router.get("/model_info")
    async def model_info() -> ModelInfoResponse:
        return ModelInfoResponse(
            model_path=str(engine.model_path),
            tokenizer_path=str(config.model_path) if has_tokenizer else None,
            weight_version=str(engine.weight_version),
            model_type=engine.model_type,
            architectures=engine.architectures,
            vocab_size=engine.vocab_size,
            context_length=engine.max_context,
            resource_id=engine.resource_id,
            engine="native",
        )

    @router.get("/engine_stats")
    async def engine_stats() -> dict[str, Any]:
        """Our extension: what a Heartbeat event reports."""
        return engine.stats().__dict__

    @router.get("/health")
    @router.get("/health_generate")
    async def health_generate() -> Response:
        """200 when the engine loop answers: paused or busy counts as alive, idle runs one token."""
        return Response(status_code=200 if await engine_answers(engine) else 503)

    return router


async def engine_answers(engine: NativeEngine) -> bool:
    """Alive and, when idle, able to generate one token within `HEALTH_TIMEOUT_S`."""
    if not engine.is_alive:
        return False
    stats = engine.stats()
    if stats.paused or stats.running or stats.queued:
        return True
    rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
    probe = engine.submit([0], SamplingOptions(max_new_tokens=1, temperature=0.0), rid=rid)
    try:
        await asyncio.wait_for(asyncio.wrap_future(probe), HEALTH_TIMEOUT_S)
    except TimeoutError:  # a pause raced the probe, or the loop is stuck
        await asyncio.to_thread(engine.abort, rid)
        return False
    except InferenceError:
        return False
    return True
