"""HTTP shell of the native engine: SGLang's native API on FastAPI (`create_app(config)`).

The routes live in `routes/` by concern: `generation` (/generate), `control` (pause, continue, abort,
weight loads, cache flush; behind the control key when one is configured) and `info` (weight version,
model info, engine stats, health). `GET /metrics` serves the `sflow_inference_*` Prometheus series
(`bus.metrics`), and the control consumer's lag once the service joined the bus. `http_errors` holds
the one error mapping and the body guard that refuses hostile bodies before any route sees them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bus.metrics import ServiceMetrics, add_metrics_route
from inference_svc.config import InferenceConfig
from inference_svc.engine import NativeEngine
from inference_svc.http_errors import BodyGuard, error_response
from inference_svc.routes.control import control_key_check, control_router
from inference_svc.routes.generation import generation_router
from inference_svc.routes.info import info_router
from schemas.inference.errors import InferenceError

logger = logging.getLogger(__name__)


def create_app(config: InferenceConfig, engine: NativeEngine | None = None) -> FastAPI:
    """Builds the service; the engine is created (model loaded) here and stopped when the app stops.

    Pass `engine` to serve an existing one (the caller then owns its shutdown).
    """
    served = engine or NativeEngine.from_config(config)
    served.start()
    tokenizer = load_tokenizer(config.model_path)
    app = FastAPI(title="SeamlessFlow inference", lifespan=_stops(served) if engine is None else None)
    app.state.engine = served
    app.state.config = config
    app.add_middleware(BodyGuard, max_body_bytes=config.max_body_bytes, max_json_depth=config.max_json_depth)
    for exc_type in (RequestValidationError, InferenceError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, _handle)
    control = [Depends(control_key_check(config))] if config.control_key is not None else []
    app.include_router(generation_router(served, tokenizer))
    app.include_router(control_router(served), dependencies=control)
    app.include_router(info_router(served, config, has_tokenizer=tokenizer is not None))
    app.state.metrics = ServiceMetrics("inference")
    _export(served, app.state.metrics)
    add_metrics_route(app, app.state.metrics)
    return app


def _export(engine: NativeEngine, metrics: ServiceMetrics) -> None:
    """The engine's series (bus.metrics.CATALOG), all read from its counters when Prometheus scrapes."""
    rid = engine.resource_id
    metrics.read("sflow_inference_generated_tokens_total",
                 lambda: {(rid, str(v)): n for v, n in engine.tokens_by_version().items()})
    metrics.read("sflow_inference_requests", lambda: {(rid, "running"): engine.stats().running,
                                                      (rid, "queued"): engine.stats().queued})
    metrics.read("sflow_inference_requests_finished_total", lambda: {(rid,): engine.stats().requests_finished})
    metrics.read("sflow_inference_weight_version", lambda: {(rid,): engine.weight_version})
    metrics.read("sflow_inference_paused", lambda: {(rid,): int(engine.paused)})


def _stops(engine: NativeEngine) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The lifespan of an app that owns its engine: the engine stops with the app."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.to_thread(engine.shutdown)

    return lifespan


async def _handle(_: Request, exc: Exception) -> JSONResponse:
    return error_response(exc)


def load_tokenizer(model_path: Path) -> Any:
    """The served tokenizer, for `text` prompts and the `text` of responses; None if there is none."""
    if not any((model_path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    except (OSError, ValueError) as e:
        logger.warning("no tokenizer loaded from %s: %s", model_path, e)
        return None
