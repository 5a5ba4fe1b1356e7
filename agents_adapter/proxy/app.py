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
expect: key (401), requests in flight of the agent (429), size (413), UTF-8 / depth / surrogates /
number ranges (400, `read_json`), JSON (422), fields (400), model (404), session owner (403). Every
failure becomes an OpenAI error body {"error": {"message", "type", "param", "code"}} in one function,
`error_response`; a 5xx body never carries an exception's text (the log has it, under the error id).
The OpenAPI document describes the bodies the handlers parse; their schemas live in
`components.schemas`, so every `$ref` resolves.
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
import math
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from agents_adapter.errors import (
    AuthenticationError,
    InvalidBodyError,
    InvalidParameterError,
    MalformedRequestError,
    PayloadTooLargeError,
    ProxyError,
    RateLimitedError,
)
from agents_adapter.proxy import outputs
from agents_adapter.proxy.config import AdapterConfig, hash_api_key
from agents_adapter.proxy.dispatch import Dispatcher
from agents_adapter.proxy.openai_models import (
    BodyLimits,
    ChatCompletionRequest,
    CompletionRequest,
    DrainRequest,
    EndSessionRequest,
    RewardRequest,
    TokenGenerateRequest,
)
from agents_adapter.proxy.recording import Recorder
from agents_adapter.proxy.routing import RoutingTable
from agents_adapter.proxy.routing_feed import RoutingFeed
from agents_adapter.proxy.service import AdapterService, CallContext, Served
from agents_adapter.proxy.tito import ChatCodec
from bus.producer import EventProducer

logger = logging.getLogger(__name__)
_M = TypeVar("_M", bound=BaseModel)
_SESSION_ID = re.compile(r"^[\x21-\x7e]{1,256}$")
_SWEEP_S = 30.0
_INT64 = 2**63
_PARSE_INLINE_BYTES = 64 * 1024  # larger bodies are parsed on a worker thread, off the event loop
_BODIES: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest, CompletionRequest, TokenGenerateRequest, EndSessionRequest, RewardRequest, DrainRequest,
)


def error_response(exc: BaseException) -> Response:
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
        ref = uuid.uuid4().hex[:12]
        logger.error("unhandled error %s: %r", ref, exc, exc_info=exc)
        status, error_type, message = 500, "internal_error", f"internal error {ref}: the proxy's log has the details"
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    # A conflict is final here (an ended session, an end that differs from the first): openai clients
    # would otherwise retry a 409 as a lock timeout.
    headers = {"x-should-retry": "false"} if status == 409 else {}
    if isinstance(exc, ProxyError):
        headers |= exc.headers
    # ensure_ascii: a message quoting the request (a lone surrogate, say) must still encode
    return Response(json.dumps(body), status_code=status, headers=headers, media_type="application/json")


def _describe(errors: Any) -> tuple[str, str | None]:
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg')} (got {repr(err.get('input'))[:80]})")
    first = ".".join(str(p) for p in errors[0].get("loc", ()) if p != "body") if errors else ""
    return "; ".join(parts) or "invalid request", first or None


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused (413) as soon as it is known to be over `max_bytes`; the rest is not read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError(
            f"the body has {declared} bytes; this proxy accepts at most max_body_bytes={max_bytes}"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLargeError(f"the body is over max_body_bytes={max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number (RFC 8259)")


def read_json(raw: bytes, max_depth: int) -> dict[str, Any]:
    """A JSON object that every later step can handle: UTF-8, at most `max_depth` deep, no lone
    surrogates in strings, integers within int64, finite numbers. Raises a 400 / 422 `ProxyError`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidBodyError(
            f"the body is not valid UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} ({e.reason})"
        ) from e
    try:
        data = json.loads(text or "{}", parse_constant=_not_json)
    except RecursionError as e:
        raise InvalidBodyError(f"the body is nested deeper than max_json_depth={max_depth}") from e
    except ValueError as e:
        raise MalformedRequestError(f"the body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise InvalidParameterError(f"the body must be a JSON object, got {type(data).__name__}")
    _check_tree(data, max_depth)
    return data


def _check_tree(root: dict[str, Any], max_depth: int) -> None:
    """Walks the parsed body without recursion (a deep body must not exhaust the stack here either)."""
    stack: list[tuple[dict[str, Any] | list[Any], str, int]] = [(root, "body", 1)]
    while stack:
        node, where, depth = stack.pop()
        if depth > max_depth:
            raise InvalidBodyError(f"the body is nested deeper than max_json_depth={max_depth} (at {where})")
        for key, value in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(key, str):
                _check_text(key, f"{where} (a key)")
            if isinstance(value, dict | list):
                stack.append((value, f"{where}.{key}", depth + 1))
            elif isinstance(value, str):
                _check_text(value, f"{where}.{key}")
            elif isinstance(value, bool):
                continue
            elif isinstance(value, int) and not -_INT64 <= value < _INT64:
                raise InvalidBodyError(f"{where}.{key}: the integer {value} is outside the 64-bit range",
                                       param=f"{where}.{key}".removeprefix("body."))
            elif isinstance(value, float) and not math.isfinite(value):
                raise InvalidBodyError(f"{where}.{key}: the number is too large (it overflows to {value})",
                                       param=f"{where}.{key}".removeprefix("body."))


def _check_text(text: str, where: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidBodyError(
            f"{where}: lone surrogate {text[e.start]!a} at character {e.start}: strings must be valid Unicode"
        ) from e


def validate_body(raw: bytes, model: type[_M], max_depth: int, limits: BodyLimits) -> _M:
    """The body as `model`, after `read_json`; config-dependent field limits come in as the context."""
    data = read_json(raw, max_depth)
    try:
        return model.model_validate(data, context=limits)
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
                            avoid_grace_s=config.avoid_grace_s, max_engine_errors=config.max_engine_errors_per_call,
                            greedy_below_temperature=config.greedy_below_temperature)
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
            service.store.close()

    app = FastAPI(title="SeamlessFlow agents adapter", lifespan=lifespan)
    app.state.service = service
    app.state.routing = routing
    app.state.config = config
    limits = config.body_limits()
    inflight_by_agent: Counter[str] = Counter()
    app.state.inflight_by_agent = inflight_by_agent

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            document.setdefault("components", {}).setdefault("schemas", {}).update(_body_schemas())
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    async def handle(_: Request, exc: Exception) -> Response:
        return error_response(exc)

    for exc_type in (ProxyError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handle)

    def agent_of(request: Request) -> str:
        agent = config.agent_keys.get(hash_api_key(_bearer(request)))
        if agent is None:
            raise AuthenticationError("Incorrect API key provided")
        return agent

    @contextlib.contextmanager
    def admitted(agent: str) -> Iterator[None]:
        """At most max_inflight_per_agent call requests per agent (one agent cannot starve the others)."""
        limit = config.max_inflight_per_agent
        if inflight_by_agent[agent] >= limit:
            raise RateLimitedError(
                f"agent {agent!r} has {inflight_by_agent[agent]} requests in flight; "
                f"this proxy serves at most max_inflight_per_agent={limit} at once per agent",
                retry_after_s=config.retry_after_s,
            )
        inflight_by_agent[agent] += 1
        try:
            yield
        finally:
            inflight_by_agent[agent] -= 1
            if not inflight_by_agent[agent]:
                del inflight_by_agent[agent]

    async def parse_body(request: Request, model: type[_M]) -> _M:
        raw = await read_body(request, config.max_body_bytes)
        if len(raw) <= _PARSE_INLINE_BYTES:
            return validate_body(raw, model, config.max_json_depth, limits)
        return await asyncio.to_thread(validate_body, raw, model, config.max_json_depth, limits)

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
            request_key=_idempotency_key(request),
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
        with admitted(agent):
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
        with admitted(agent):
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
        with admitted(agent):
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
    """Housekeeping from the start on: the first round publishes what a crash left unacknowledged."""
    while True:
        await service.maintain()
        await asyncio.sleep(_SWEEP_S)


def _idempotency_key(request: Request) -> str:
    """The client's `Idempotency-Key` (the SDK sends one per call, the same on each retry of it)."""
    key = request.headers.get("idempotency-key", "")
    if key and not _SESSION_ID.match(key):
        raise InvalidParameterError("Idempotency-Key must be 1-256 printable ASCII characters without spaces",
                                    param="Idempotency-Key")
    return key


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """Documents a body that the handler parses itself (so the order of checks stays ours); the schema
    itself is in components.schemas (`_body_schemas`)."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _body_schemas() -> dict[str, Any]:
    """The request bodies and every model they use, named as the `$ref`s of `_schema` and of each other."""
    _, top = models_json_schema([(m, "validation") for m in _BODIES], ref_template="#/components/schemas/{model}")
    return dict(top.get("$defs", {}))
