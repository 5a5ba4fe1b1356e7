"""HTTP shell of the native engine: SGLang's native API on FastAPI (`create_app(config)`).

Every failure becomes an OpenAI/SGLang-style error body ({"error": {"message", "type", "param",
"code"}}) in one place, `error_response`; a bad request never reaches the decode loop, so the engine
keeps serving after it. Malformed JSON and schema violations are 400 (FastAPI's 422 is remapped, as
SGLang does).

Before any route sees a body, `BodyGuard` refuses what would otherwise reach the JSON parser or the
tokenizer as a trap: a body over `max_body_bytes` (413), invalid UTF-8, nesting deeper than
`max_json_depth` (the parser would recurse until RecursionError) and lone UTF-16 surrogates (which
cannot be encoded back to UTF-8 in a log line, a tokenizer or a response), each a 400 naming the
problem. A 5xx body never carries an exception's text: it gives an error id, and the log has the rest.

Control endpoints (pause, continue, abort, weight loads, cache flush) require the control key when one
is configured (`InferenceConfig`: without a key the service binds to loopback only).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inference_svc.config import InferenceConfig
from inference_svc.engine import NativeEngine
from schemas.inference.errors import (
    InferenceError,
    InvalidRequestError,
    PayloadTooLargeError,
    UnauthorizedError,
    WeightLoadError,
)
from schemas.inference.protocol import (
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
from schemas.inference.types import GenerationResult, SamplingOptions

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
        status, error_type, message = exc.status_code, exc.error_type, public_message(exc)
    elif isinstance(exc, StarletteHTTPException):
        status, error_type, message = exc.status_code, "http_error", str(exc.detail)
    else:
        status, error_type, message = 500, "internal_error", public_message(exc)
    body: dict[str, Any] = ErrorBody(
        error=ErrorDetail(message=message, type=error_type, param=param, code=status)
    ).model_dump()
    if isinstance(exc, WeightLoadError):  # SGLang's /update_weights_from_disk failure keys, for its clients
        body.update(success=False, message=message, num_paused_requests=0)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, UnauthorizedError) else None
    return JSONResponse(body, status_code=status, headers=headers)


def public_message(exc: Exception) -> str:
    """What a caller may read of `exc`: our own messages; for anything else an id into the log."""
    if isinstance(exc, InferenceError) and exc.expose_message:
        return str(exc)
    error_id = uuid.uuid4().hex[:12]
    logger.error("internal error %s: %r", error_id, exc, exc_info=exc, extra={"error_id": error_id})
    return f"internal error (id {error_id}); the service log has the details"


def body_problem(body: bytes, max_depth: int) -> str | None:
    """Why a request body must be refused before parsing, or None (malformed JSON is left to FastAPI)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"the request body is not valid UTF-8 (byte 0x{body[e.start]:02x} at offset {e.start})"
    try:
        parsed = json.loads(text)
    except RecursionError:
        return f"the JSON body nests deeper than max_json_depth={max_depth}"
    except ValueError:
        return None
    stack: list[tuple[Any, int, str]] = [(parsed, 0, "body")]
    while stack:
        value, depth, where = stack.pop()
        if depth > max_depth:
            return f"the JSON body nests deeper than max_json_depth={max_depth} (at {where[:120]})"
        if isinstance(value, str):
            if _has_lone_surrogate(value):
                return f"{where[:120]} holds a lone UTF-16 surrogate (not a Unicode character)"
        elif isinstance(value, dict):
            for key, item in value.items():
                if _has_lone_surrogate(key):
                    return f"a key in {where[:120]} holds a lone UTF-16 surrogate (not a Unicode character)"
                stack.append((item, depth + 1, f"{where}.{key}"))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, f"{where}[{i}]") for i, item in enumerate(value))
    return None


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class BodyGuard:
    """ASGI middleware: reads a request body once, refuses it (see `body_problem`), else replays it."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_json_depth: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        too_large = PayloadTooLargeError(f"the request body is larger than max_body_bytes={self.max_body_bytes}")
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await error_response(too_large)(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the caller hung up before sending it all
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await error_response(too_large)(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        problem = body_problem(body, self.max_json_depth) if body else None
        if problem is not None:
            await error_response(InvalidRequestError(problem))(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


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
    app.add_middleware(BodyGuard, max_body_bytes=config.max_body_bytes, max_json_depth=config.max_json_depth)
    control = [Depends(_control_key_check(config))] if config.control_key is not None else []

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

    async def prompt_ids(req: GenerateRequest) -> list[int]:
        if req.input_ids is not None:
            return req.input_ids
        if tokenizer is None:
            raise InvalidRequestError("this model directory has no tokenizer: send input_ids instead of text")
        try:  # off the event loop: a long text must not stall every other request
            return list(await asyncio.to_thread(tokenizer.encode, req.text, add_special_tokens=False))
        except (TypeError, ValueError) as e:
            raise InvalidRequestError(f"text cannot be tokenized: {type(e).__name__}") from e

    @app.post("/generate", response_model=None)
    async def generate(req: GenerateRequest, request: Request) -> Response | dict[str, Any]:
        ids = await prompt_ids(req)
        sampling = req.sampling_params.to_options()
        rid = req.rid or uuid.uuid4().hex
        if req.stream:  # submitted (and so validated) before the 200 starts: a bad request is still a 400
            loop = asyncio.get_running_loop()
            updates: asyncio.Queue[GenerationResult] = asyncio.Queue()
            future = served.submit(
                ids, sampling, rid=rid, listener=lambda snap: loop.call_soon_threadsafe(updates.put_nowait, snap)
            )
            return StreamingResponse(stream(req, rid, future, updates), media_type="text/event-stream")
        pending = asyncio.wrap_future(served.submit(ids, sampling, rid=rid))
        while not pending.done():  # a caller that hung up no longer holds a slot
            await asyncio.wait({pending}, timeout=DISCONNECT_POLL_S)
            if not pending.done() and await request.is_disconnected():
                await asyncio.to_thread(served.abort, rid)
                logger.info("caller disconnected: request aborted", extra={"rid": rid})
        return render(pending.result(), req).model_dump()

    async def stream(
        req: GenerateRequest, rid: str, future: Future[GenerationResult], updates: asyncio.Queue[GenerationResult]
    ) -> AsyncGenerator[bytes]:
        done = asyncio.wrap_future(future)
        try:
            while not done.done():
                getter = asyncio.ensure_future(updates.get())
                await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield _sse(render(getter.result(), req).model_dump())
                else:
                    getter.cancel()
        finally:
            if not done.done():  # the caller hung up mid-stream: free its slot
                await asyncio.to_thread(served.abort, rid)
        try:
            yield _sse(render(done.result(), req).model_dump())
        except InferenceError as e:
            yield _sse({"error": {"message": public_message(e), "type": e.error_type, "code": e.status_code}})
        yield b"data: [DONE]\n\n"

    @app.post("/pause_generation", dependencies=control)
    async def pause_generation(req: PauseGenerationRequest) -> ControlResponse:
        held = await asyncio.to_thread(served.pause, req.mode)
        return ControlResponse(message="Generation paused successfully.", num_requests=held)

    @app.post("/continue_generation", dependencies=control)
    async def continue_generation(req: ContinueGenerationRequest | None = None) -> ControlResponse:
        await asyncio.to_thread(served.resume)
        return ControlResponse(message="Generation continued successfully.")

    @app.post("/abort_request", dependencies=control)
    async def abort_request(req: AbortRequest) -> AbortResponse:
        if req.abort_all:
            return AbortResponse(num_aborted=await asyncio.to_thread(served.abort_all))
        return AbortResponse(num_aborted=int(await asyncio.to_thread(served.abort, req.rid)))

    @app.post("/update_weights_from_disk", dependencies=control)
    async def update_weights_from_disk(req: UpdateWeightsFromDiskRequest) -> UpdateWeightsFromDiskResponse:
        if req.keep_pause:
            await asyncio.to_thread(served.pause, "in_place")
        result = await asyncio.to_thread(
            served.update_weights_from_disk, req.model_path, req.version(), abort_all_requests=req.abort_all_requests,
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

    @app.get("/flush_cache", dependencies=control, operation_id="flush_cache_get")
    @app.post("/flush_cache", dependencies=control, operation_id="flush_cache")
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


def _control_key_check(config: InferenceConfig) -> Any:
    """The dependency that guards control endpoints: `Authorization: Bearer <control_key>`."""
    assert config.control_key is not None
    expected = config.control_key.get_secret_value().encode("utf-8")
    bearer = HTTPBearer(auto_error=False, description="the control key (InferenceConfig.control_key)")

    async def check(credentials: HTTPAuthorizationCredentials | None = Security(bearer)) -> None:
        given = b"" if credentials is None else credentials.credentials.encode("latin-1", "replace")
        if not hmac.compare_digest(given, expected):
            raise UnauthorizedError("this control endpoint needs the control key: send Authorization: Bearer <key>")

    return check


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
