"""HTTP shell of the capture proxy: OpenAI-compatible endpoints on FastAPI (`create_app(config)`).

Endpoints (agent key = `Authorization: Bearer <key>`; admin key likewise):
  GET  /health                         liveness (no key)
  GET  /v1/models                      the served model
  POST /v1/chat/completions            chat (stream / n / logprobs / tools / stop ...)
  POST /v1/completions                 text or token-id prompts
  POST /v1/generate                    token-in / token-out (SGLang's /generate shape + session)
  GET  /v1/sessions/{id}               the session's state (its owner only)
  POST /v1/sessions/{id}/end           {reward?, status}: SessionEnded now, or later with /reward
  POST /v1/sessions/{id}/reward        {reward, status?}: the reward of a session ended without one
  GET  /admin/stats                    counters, drift per agent, sessions, routing table (admin key)
  POST /admin/drain                    stop taking calls, wait for those in flight (admin key)

Session id: header `X-Session-Id`, else the body's `user`, else a fresh `anon-...` id (a one-call
session); task and group: headers `X-Task-Id` / `X-Group-Id`, else `metadata.task_id` / `group_id`.

Bodies are parsed here (not by FastAPI's signature binding) so the order of checks is the one agents
expect: key (401), JSON (422), fields (400), model (404), session owner (403). Every failure becomes an
OpenAI error body {"error": {"message", "type", "param", "code"}} in one function, `error_response`.
Streaming answers are sent once the call is recorded (Kafka acknowledged it): the chunks then go out
at once, so a stream never starts for a call that could still fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from agents_adapter import outputs
from agents_adapter.config import AdapterConfig, hash_api_key
from agents_adapter.dispatch import Dispatcher
from agents_adapter.errors import (
    AuthenticationError,
    InvalidParameterError,
    MalformedRequestError,
    ProxyError,
)
from agents_adapter.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    DrainRequest,
    EndSessionRequest,
    RewardRequest,
    TokenGenerateRequest,
)
from agents_adapter.recording import Recorder
from agents_adapter.routing import RoutingTable
from agents_adapter.routing_feed import RoutingFeed
from agents_adapter.service import AdapterService, CallContext, Served
from agents_adapter.tito import ChatCodec
from bus.producer import EventProducer

logger = logging.getLogger(__name__)
_M = TypeVar("_M", bound=BaseModel)
_SESSION_ID = re.compile(r"^[\x21-\x7e]{1,256}$")
_SWEEP_S = 30.0


def error_response(exc: BaseException) -> JSONResponse:
    """The one mapping from an exception to an HTTP error (OpenAI's error body)."""
    param: str | None = None
    code: str | None = None
    if isinstance(exc, ProxyError):
        status, error_type, message, param, code = exc.status_code, exc.error_type, str(exc), exc.param, exc.code
    elif isinstance(exc, RequestValidationError):
        status, error_type, message, param = 400, "invalid_request_error", *_describe(exc.errors())
        code = "invalid_parameter"
    elif isinstance(exc, StarletteHTTPException):
        status, error_type, message = exc.status_code, "invalid_request_error", str(exc.detail)
        code = "not_found" if status == 404 else None
    else:
        logger.error("unhandled error: %r", exc, exc_info=exc)
        status, error_type, message = 500, "internal_error", f"{type(exc).__name__}: {exc}"
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _describe(errors: Any) -> tuple[str, str | None]:
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg')} (got {repr(err.get('input'))[:80]})")
    first = ".".join(str(p) for p in errors[0].get("loc", ()) if p != "body") if errors else ""
    return "; ".join(parts) or "invalid request", first or None


async def parse_body(request: Request, model: type[_M]) -> _M:
    raw = await request.body()
    try:
        data = json.loads(raw or b"{}")
    except ValueError as e:
        raise MalformedRequestError(f"the body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise InvalidParameterError(f"the body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        message, param = _describe(e.errors())
        raise InvalidParameterError(message, param=param) from e


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError(
            "You didn't provide an API key: send 'Authorization: Bearer <key>'"
        )
    return token.strip()


def create_app(config: AdapterConfig, *, codec: ChatCodec | None = None,
               producer: EventProducer | None = None) -> FastAPI:
    """Builds the proxy. The tokenizer and template are loaded (and probed) here; Kafka is reached
    lazily by the producer, and the routing feed starts with the app."""
    codec = codec or ChatCodec.from_model_dir(config.model_path)
    routing = RoutingTable(sticky=config.sticky_sessions, unreachable_cooldown_s=config.unreachable_cooldown_s)
    for endpoint in config.inference_endpoints:
        routing.add_static(endpoint.resource_id, endpoint.url)
    producer = producer or EventProducer(
        config.bus, producer_id=config.instance_id, delivery_timeout_ms=config.delivery_timeout_ms,
        **{"linger.ms": config.producer_linger_ms},
    )
    recorder = Recorder(producer, ack_timeout_s=config.delivery_timeout_ms / 1000 + 1.0)
    dispatcher = Dispatcher(routing, request_timeout_s=config.long_request_timeout_s,
                            max_segments=config.max_segments, max_connections=config.max_engine_connections,
                            avoid_grace_s=config.avoid_grace_s)
    service = AdapterService(config, codec, routing, dispatcher, recorder)
    feed = RoutingFeed(config.bus, routing) if config.routing_from_events else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        dispatcher.attach(asyncio.get_running_loop())
        if feed is not None:
            feed.start()
        sweeper = asyncio.create_task(_sweep(service))
        logger.info("agents adapter up", extra={"config": config.redacted()})
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            if feed is not None:
                await asyncio.to_thread(feed.stop)
            await dispatcher.aclose()
            await asyncio.to_thread(recorder.close)

    app = FastAPI(title="SeamlessFlow agents adapter", lifespan=lifespan)
    app.state.service = service
    app.state.routing = routing
    app.state.config = config

    async def handle(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    for exc_type in (ProxyError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handle)

    def agent_of(request: Request) -> str:
        agent = config.agent_keys.get(hash_api_key(_bearer(request)))
        if agent is None:
            raise AuthenticationError("Incorrect API key provided")
        return agent

    def require_admin(request: Request) -> None:
        digest = hash_api_key(_bearer(request))
        if config.admin_key_sha256 is None or not hmac.compare_digest(digest, config.admin_key_sha256):
            raise AuthenticationError("this endpoint needs the admin key")

    def context(request: Request, agent_id: str, user: str | None, metadata: dict[str, str] | None) -> CallContext:
        session_id = request.headers.get("x-session-id") or user or f"anon-{uuid.uuid4().hex}"
        if not _SESSION_ID.match(session_id):
            raise InvalidParameterError("X-Session-Id must be 1-256 printable ASCII characters without spaces",
                                        param="X-Session-Id")
        meta = dict(metadata or {})
        return CallContext(
            agent_id=agent_id,
            session_id=session_id,
            task_id=request.headers.get("x-task-id") or meta.get("task_id", ""),
            group_id=request.headers.get("x-group-id") or meta.get("group_id", ""),
            metadata=meta,
        )

    def respond(served: Served, stream: bool, chunks: Callable[[], list[dict[str, Any]]],
                body: Callable[[], dict[str, Any]]) -> Response:
        headers = {"X-Session-Id": served.session_id}
        if not stream:
            return JSONResponse(body(), headers=headers)
        payload = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks()) + b"data: [DONE]\n\n"

        async def sse() -> AsyncIterator[bytes]:
            yield payload

        return StreamingResponse(sse(), media_type="text/event-stream", headers=headers)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "draining": service.draining, "usable_resources": len(routing.usable_ids())}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        agent_of(request)
        return {"object": "list", "data": [
            {"id": config.model_name, "object": "model", "created": 0, "owned_by": "seamlessflow",
             "max_model_len": service.context_tokens},
        ]}

    @app.post("/v1/chat/completions", response_model=None,
              openapi_extra=_schema(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        agent = agent_of(request)
        req = await parse_body(request, ChatCompletionRequest)
        served = await _counted(service, service.chat(context(request, agent, req.user, req.metadata), req))
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return respond(
            served, req.stream,
            lambda: outputs.chat_chunks(served.response_id, req.model, served.replies, served.prompt_tokens,
                                        served.logprobs, include_usage, served.extra),
            lambda: outputs.chat_completion(served.response_id, req.model, served.replies, served.prompt_tokens,
                                            served.logprobs, served.extra),
        )

    @app.post("/v1/completions", response_model=None, openapi_extra=_schema(CompletionRequest))
    async def completions(request: Request) -> Response:
        agent = agent_of(request)
        req = await parse_body(request, CompletionRequest)
        served = await _counted(service, service.complete(context(request, agent, req.user, req.metadata), req))
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return respond(
            served, req.stream,
            lambda: outputs.text_chunks(served.response_id, req.model, served.replies, served.prompt_tokens,
                                        served.logprobs, include_usage, served.extra),
            lambda: outputs.text_completion(served.response_id, req.model, served.replies, served.prompt_tokens,
                                            served.logprobs, served.extra),
        )

    @app.post("/v1/generate", response_model=None, openapi_extra=_schema(TokenGenerateRequest))
    async def generate(request: Request) -> Response:
        agent = agent_of(request)
        req = await parse_body(request, TokenGenerateRequest)
        served = await _counted(service, service.generate(context(request, agent, req.user, req.metadata), req))
        reply = served.replies[0]
        call = reply.call
        meta: dict[str, Any] = {
            "id": reply.call_id,
            "finish_reason": {"type": call.finish_reason},
            "prompt_tokens": len(call.prompt_ids),
            "completion_tokens": len(call.output_ids),
            "weight_version": str(call.versions[-1]) if call.versions else None,
            "output_token_versions": call.versions,
            "segments": [dataclasses.asdict(s) for s in call.segments],
            "session_id": served.session_id,
            "turn": reply.turn,
            "drift": served.extra["drift"],
            "parent_call_id": served.extra["parent_call_id"],
        }
        if req.return_logprob:
            meta["output_token_logprobs"] = [
                [lp, tok, None] for lp, tok in zip(call.logprobs, call.output_ids, strict=True)
            ]
        body = {"text": reply.text, "output_ids": call.output_ids, "meta_info": meta}
        return JSONResponse(body, headers={"X-Session-Id": served.session_id})

    @app.get("/v1/sessions/{session_id}")
    async def session_info(session_id: str, request: Request) -> dict[str, Any]:
        return service.session_info(agent_of(request), session_id)

    @app.post("/v1/sessions/{session_id}/end", response_model=None, openapi_extra=_schema(EndSessionRequest))
    async def end_session(session_id: str, request: Request) -> Response:
        agent = agent_of(request)
        req = await parse_body(request, EndSessionRequest)
        result = await service.end_session(agent, session_id, req.reward, req.status,
                                           task_id=request.headers.get("x-task-id", ""),
                                           group_id=request.headers.get("x-group-id", ""))
        return JSONResponse(result, status_code=202 if req.reward is None else 200)

    @app.post("/v1/sessions/{session_id}/reward", openapi_extra=_schema(RewardRequest))
    async def report_reward(session_id: str, request: Request) -> dict[str, Any]:
        agent = agent_of(request)
        req = await parse_body(request, RewardRequest)
        return await service.report_reward(agent, session_id, req.reward, req.status)

    @app.get("/admin/stats")
    async def admin_stats(request: Request) -> dict[str, Any]:
        require_admin(request)
        return service.stats() | {"config": config.redacted()}

    @app.post("/admin/drain", openapi_extra=_schema(DrainRequest))
    async def admin_drain(request: Request) -> dict[str, Any]:
        require_admin(request)
        req = await parse_body(request, DrainRequest)
        return await service.drain(req.stop_accepting, req.timeout_s, req.end_sessions)

    return app


async def _counted(service: AdapterService, call: Awaitable[Served]) -> Served:
    """Awaits a call, counting failures by error code for /admin/stats."""
    try:
        served = await call
    except ProxyError as e:
        service.requests_failed[e.code or type(e).__name__] += 1
        raise
    return served


async def _sweep(service: AdapterService) -> None:
    while True:
        await asyncio.sleep(_SWEEP_S)
        service.sessions.sweep()


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """Documents a body that the handler parses itself (so the order of checks stays ours)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}
