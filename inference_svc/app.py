"""HTTP shell of the native engine: SGLang's native API on FastAPI (`create_app(config)`).

Every failure becomes an OpenAI/SGLang-style error body ({"error": {"message", "type", "param",
"code"}}) in one place, `error_response`; a bad request never reaches the decode loop, so the engine
keeps serving after it. Malformed JSON and schema violations are 400 (FastAPI's 422 is remapped, as
SGLang does).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inference_svc.config import InferenceConfig
from inference_svc.engine import GenerationResult, NativeEngine, SamplingOptions
from inference_svc.errors import InferenceError, InvalidRequestError, WeightLoadError
from inference_svc.protocol import (
    AbortRequest,
    AbortResponse,
    ContinueGenerationRequest,
    ControlResponse,
    ErrorBody,
    ErrorDetail,
    GenerateRequest,
    GenerateResponse,
    ModelInfoResponse,
    PauseGenerationRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDiskResponse,
    WeightVersionResponse,
    generate_response,
)

logger = logging.getLogger(__name__)
HEALTH_TIMEOUT_S = 20.0
DISCONNECT_POLL_S = 0.5


def error_response(exc: Exception) -> JSONResponse:
    """The one mapping from an exception to an HTTP error response."""
    param: str | None = None
    if isinstance(exc, RequestValidationError):
        status, error_type = 400, "invalid_request_error"
        message, param = _describe_validation_errors(exc.errors())
    elif isinstance(exc, InferenceError):
        status, error_type, message = exc.status_code, exc.error_type, str(exc)
    elif isinstance(exc, StarletteHTTPException):
        status, error_type, message = exc.status_code, "http_error", str(exc.detail)
    else:
        logger.error("unhandled error: %r", exc, exc_info=exc)
        status, error_type, message = 500, "internal_error", f"{type(exc).__name__}: {exc}"
    body: dict[str, Any] = ErrorBody(
        error=ErrorDetail(message=message, type=error_type, param=param, code=status)
    ).model_dump()
    if isinstance(exc, WeightLoadError):  # SGLang's /update_weights_from_disk failure keys, for its clients
        body.update(success=False, message=message, num_paused_requests=0)
    return JSONResponse(body, status_code=status)


def _describe_validation_errors(errors: Any) -> tuple[str, str | None]:
    parts = []
    if any(err.get("type") == "json_invalid" for err in errors):
        return "malformed JSON body: " + "; ".join(str(err.get("ctx", {}).get("error", "")) for err in errors), None
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        got = repr(err.get("input"))
        parts.append(f"{where}: {err.get('msg')} (got {got[:80]})")
    first_loc = [str(p) for p in errors[0].get("loc", ()) if p != "body"] if errors else []
    return "; ".join(parts) or "invalid request", ".".join(first_loc) or None


def _load_tokenizer(model_path: Path) -> Any:
    """The served tokenizer, for `text` prompts and the `text` of responses; None if there is none."""
    if not any((model_path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    except (OSError, ValueError) as e:
        logger.warning("no tokenizer loaded from %s: %s", model_path, e)
        return None


def create_app(config: InferenceConfig, engine: NativeEngine | None = None) -> FastAPI:
    """Builds the service; the engine is created (model loaded) here and stopped when the app stops.

    Pass `engine` to serve an existing one (the caller then owns its shutdown).
    """
    owns_engine = engine is None
    served = engine or NativeEngine.from_config(config)
    served.start()
    tokenizer = _load_tokenizer(config.model_path)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if owns_engine:
                await asyncio.to_thread(served.shutdown)

    app = FastAPI(title="SeamlessFlow inference", lifespan=lifespan)
    app.state.engine = served
    app.state.config = config

    async def handle(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    for exc_type in (RequestValidationError, InferenceError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handle)

    def render(result: GenerationResult, req: GenerateRequest) -> GenerateResponse:
        skip = req.sampling_params.skip_special_tokens
        text = tokenizer.decode(result.output_ids, skip_special_tokens=skip) if tokenizer else ""
        token_texts = (
            [tokenizer.decode([t]) for t in result.output_ids]
            if tokenizer is not None and req.return_logprob and req.return_text_in_logprobs
            else None
        )
        return generate_response(result, return_logprob=req.return_logprob, text=text, token_texts=token_texts)

    def prompt_ids(req: GenerateRequest) -> list[int]:
        if req.input_ids is not None:
            return req.input_ids
        if tokenizer is None:
            raise InvalidRequestError("this model directory has no tokenizer: send input_ids instead of text")
        return list(tokenizer.encode(req.text, add_special_tokens=False))

    @app.post("/generate", response_model=None)
    async def generate(req: GenerateRequest, request: Request) -> Response | dict[str, Any]:
        ids = prompt_ids(req)
        sampling = req.sampling_params.to_options()
        if req.stream:
            return StreamingResponse(stream(req, ids, sampling), media_type="text/event-stream")
        rid = req.rid or uuid.uuid4().hex
        pending = asyncio.wrap_future(served.submit(ids, sampling, rid=rid))
        while not pending.done():  # a caller that hung up no longer holds a slot
            await asyncio.wait({pending}, timeout=DISCONNECT_POLL_S)
            if not pending.done() and await request.is_disconnected():
                await asyncio.to_thread(served.abort, rid)
                logger.info("caller disconnected: request aborted", extra={"rid": rid})
        return render(pending.result(), req).model_dump()

    async def stream(req: GenerateRequest, ids: list[int], sampling: SamplingOptions) -> AsyncGenerator[bytes]:
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[GenerationResult] = asyncio.Queue()
        future = served.submit(
            ids, sampling, rid=req.rid, listener=lambda snap: loop.call_soon_threadsafe(updates.put_nowait, snap)
        )
        done = asyncio.wrap_future(future)
        while not done.done():
            getter = asyncio.ensure_future(updates.get())
            await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield _sse(render(getter.result(), req).model_dump())
            else:
                getter.cancel()
        try:
            yield _sse(render(done.result(), req).model_dump())
        except InferenceError as e:
            yield _sse({"error": {"message": str(e), "type": e.error_type, "code": e.status_code}})
        yield b"data: [DONE]\n\n"

    @app.post("/pause_generation")
    async def pause_generation(req: PauseGenerationRequest) -> ControlResponse:
        held = await asyncio.to_thread(served.pause, req.mode)
        return ControlResponse(message="Generation paused successfully.", num_requests=held)

    @app.post("/continue_generation")
    async def continue_generation(req: ContinueGenerationRequest | None = None) -> ControlResponse:
        await asyncio.to_thread(served.resume)
        return ControlResponse(message="Generation continued successfully.")

    @app.post("/abort_request")
    async def abort_request(req: AbortRequest) -> AbortResponse:
        if req.abort_all:
            return AbortResponse(num_aborted=await asyncio.to_thread(served.abort_all))
        return AbortResponse(num_aborted=int(await asyncio.to_thread(served.abort, req.rid)))

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(req: UpdateWeightsFromDiskRequest) -> UpdateWeightsFromDiskResponse:
        if req.keep_pause:
            await asyncio.to_thread(served.pause, "in_place")
        result = await asyncio.to_thread(
            served.update_weights_from_disk, req.model_path, req.version(), abort_all_requests=req.abort_all_requests
        )
        return UpdateWeightsFromDiskResponse(
            success=result.success,
            message=result.message,
            num_paused_requests=result.num_paused_requests,
            weight_version=str(result.weight_version),
            load_ms=result.load_ms,
            apply_ms=result.apply_ms,
        )

    @app.get("/get_weight_version")
    @app.get("/weight_version")
    async def get_weight_version() -> WeightVersionResponse:
        return WeightVersionResponse(weight_version=str(served.weight_version))

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> ModelInfoResponse:
        return ModelInfoResponse(
            model_path=str(served.model_path),
            tokenizer_path=str(config.model_path) if tokenizer is not None else None,
            weight_version=str(served.weight_version),
            model_type=served.model_type,
            architectures=served.architectures,
            vocab_size=served.vocab_size,
            context_length=served.max_context,
            resource_id=served.resource_id,
            engine="native",
        )

    @app.get("/engine_stats")
    async def engine_stats() -> dict[str, Any]:
        """Our extension: what a Heartbeat event reports."""
        return served.stats().__dict__

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        flushed = served.flush_cache()
        return Response("Cache flushed.\n" if flushed else "Cache not flushed.\n", status_code=200 if flushed else 400)

    @app.get("/health")
    @app.get("/health_generate")
    async def health_generate() -> Response:
        """200 when the engine loop answers: paused or busy counts as alive, idle runs one token."""
        if not served.is_alive:
            return Response(status_code=503)
        stats = served.stats()
        if stats.paused or stats.running or stats.queued:
            return Response(status_code=200)
        rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
        probe = served.submit([0], SamplingOptions(max_new_tokens=1, temperature=0.0), rid=rid)
        try:
            await asyncio.wait_for(asyncio.wrap_future(probe), HEALTH_TIMEOUT_S)
        except TimeoutError:  # a pause raced the probe, or the loop is stuck
            await asyncio.to_thread(served.abort, rid)
            return Response(status_code=503)
        except InferenceError:
            return Response(status_code=503)
        return Response(status_code=200)

    return app


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
