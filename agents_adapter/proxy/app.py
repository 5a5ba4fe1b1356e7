"""HTTP shell of the capture proxy: OpenAI-compatible endpoints on FastAPI (`create_app(config)`).

Endpoints (agent key = `Authorization: Bearer <key>`; admin key likewise):
  GET  /health                         liveness (no key)
  GET  /v1/models                      the served model
  POST /v1/chat/completions            chat (stream / n / logprobs / tools / stop ...)
  POST /v1/completions                 text or token-id prompts
  POST /v1/generate                    token-in / token-out (SGLang's /generate shape + session)
  POST /v1/responses                   OpenAI's Responses API (`responses_api`: function tools,
                                       previous_response_id, stream)
  POST /v1/messages                    Anthropic's Messages API (`anthropic_api`: tool_use /
                                       tool_result, stream); key also as `x-api-key`
  GET  /v1/sessions/{id}               the session's state (its owner only)
  POST /v1/sessions/{id}/end           {reward?, status}: SessionEnded now, or later with /reward
  POST /v1/sessions/{id}/reward        {reward, status?}: the reward of a session ended without one
  GET  /admin/stats                    counters, drift per agent, sessions, routing table (admin key)
  GET  /metrics                        Prometheus series `sflow_proxy_*` (bus.metrics; no key, like /health)
  POST /admin/drain                    stop taking calls, wait for those in flight (admin key)
  /sessions/{id}/v1/...                any of the /v1 routes above, in session {id} (for agents that
                                       cannot send `X-Session-Id`: their base URL names the session;
                                       `asgi.session_base_path`)

Sessions and the order of a request's checks: `http_requests`. Every failure becomes an OpenAI error
body {"error": {"message", "type", "param", "code"}} in one function,
`asgi.error_response` (the call routes are served by `asgi.ProxyApp` ahead of FastAPI's routing);
a 5xx body never carries an exception's text (the log has it, under the error id).
The OpenAPI document describes the bodies the handlers parse; their schemas live in
`components.schemas`, so every `$ref` resolves.
Streaming answers are sent once the call is recorded (Kafka acknowledged it): the chunks then go out
at once, so a stream never starts for a call that could still fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from agents_adapter.errors import ProxyError
from agents_adapter.proxy import outputs
from agents_adapter.proxy.anthropic_api import MessagesApi, MessagesRequest, message_body, message_events
from agents_adapter.proxy.asgi import FAST_ROUTES, ProxyApp, error_response
from agents_adapter.proxy.chat_codec import ChatCodec
from agents_adapter.proxy.config import AdapterConfig
from agents_adapter.proxy.dispatch import Dispatcher
from agents_adapter.proxy.http_requests import RequestGate, call_context
from agents_adapter.proxy.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    DrainRequest,
    EndSessionRequest,
    RewardRequest,
    TokenGenerateRequest,
)
from agents_adapter.proxy.openapi_doc import body_doc, openapi_with_bodies
from agents_adapter.proxy.recording import Recorder
from agents_adapter.proxy.responses_api import ResponsesApi, ResponsesRequest, response_body, response_events
from agents_adapter.proxy.routing import RoutingTable
from agents_adapter.proxy.routing_feed import RoutingFeed
from agents_adapter.proxy.service import AdapterService, CallContext, Served
from agents_adapter.proxy.session_book import SessionBook
from bus.metrics import ServiceMetrics, add_metrics_route
from bus.producer import EventProducer

logger = logging.getLogger(__name__)
_SWEEP_S = 30.0
_Call = TypeVar("_Call", ChatCompletionRequest, CompletionRequest, TokenGenerateRequest, ResponsesRequest,
                MessagesRequest)
_Sampled = TypeVar("_Sampled", ChatCompletionRequest, CompletionRequest)


def create_app(config: AdapterConfig, *, codec: ChatCodec | None = None,
               producer: EventProducer | None = None) -> FastAPI:
    """Builds the proxy. The tokenizer and template are loaded (and probed) here; Kafka is reached
    lazily by the producer, and the routing feed starts with the app."""
    metrics = ServiceMetrics("proxy")
    service, feed = _build_service(config, codec, producer, metrics)
    _export(service, metrics)
    gate = RequestGate(config)
    app = ProxyApp(title="SeamlessFlow agents adapter", lifespan=_lifespan(service, feed))
    app.state.service = service
    app.state.routing = service.routing
    app.state.config = config
    app.state.inflight_by_agent = gate.inflight_by_agent

    async def handle(_: Request, exc: Exception) -> Response:
        return error_response(exc)

    for exc_type in (ProxyError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handle)
    routers = (_call_routes(service, gate), _translated_routes(service, gate), _session_routes(service.book, gate),
               _admin_routes(service, gate))
    for router in routers:
        app.include_router(router)
    add_metrics_route(app, metrics)
    app.fast_routes = {("POST", route.path): route.endpoint for router in routers for route in router.routes
                       if isinstance(route, APIRoute) and route.path in FAST_ROUTES and route.methods == {"POST"}}
    app.openapi = openapi_with_bodies(app)  # type: ignore[method-assign]
    return app


def _export(service: AdapterService, metrics: ServiceMetrics) -> None:
    """The proxy's series (bus.metrics.CATALOG): its own counters, read at scrape time, and the one
    histogram observed per call."""
    metrics.read("sflow_proxy_calls_served_total", lambda: service.calls_served)
    metrics.read("sflow_proxy_events_recorded_total", lambda: service.recorder.recorded)
    metrics.read("sflow_proxy_events_record_failed_total", lambda: service.recorder.failed)
    metrics.read("sflow_proxy_requests_failed_total",
                 lambda: {(code,): n for code, n in service.requests_failed.items()})
    metrics.read("sflow_proxy_inflight_requests", lambda: service.book.inflight)
    service.observe_added_latency = metrics.histogram("sflow_proxy_added_latency_seconds").observe


def _build_service(config: AdapterConfig, codec: ChatCodec | None, producer: EventProducer | None,
                   metrics: ServiceMetrics) -> tuple[AdapterService, RoutingFeed | None]:
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
    return service, RoutingFeed(config.bus, routing, metrics=metrics) if config.routing_from_events else None


def _lifespan(service: AdapterService,
              feed: RoutingFeed | None) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.dispatcher.attach(asyncio.get_running_loop())
        if feed is not None:
            feed.start()
        sweeper = asyncio.create_task(_sweep(service.book))
        logger.info("agents adapter up", extra={"config": service.config.redacted()})
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            if feed is not None:
                await asyncio.to_thread(feed.stop)
            await service.dispatcher.aclose()
            await asyncio.to_thread(service.recorder.close)
            service.book.store.close()

    return lifespan


async def _sweep(book: SessionBook) -> None:
    """Housekeeping from the start on: the first round publishes what a crash left unacknowledged."""
    while True:
        await book.maintain()
        await asyncio.sleep(_SWEEP_S)


# ----- routes


def _own_hints(_: str, req: Any) -> tuple[str | None, dict[str, str] | None]:
    """An OpenAI body's session hint and metadata: its `user` and `metadata` fields."""
    return req.user, req.metadata


_Served = Callable[..., Awaitable[tuple[Any, Served]]]


def _server(service: AdapterService, gate: RequestGate) -> _Served:
    """What every call route does: key, admission, body, session, then the call (failures counted)."""

    async def served(request: Request, model: type[_Call], run: Callable[[CallContext, _Call], Awaitable[Served]],
                     hints: Callable[[str, _Call], tuple[str | None, dict[str, str] | None]] = _own_hints,
                     ) -> tuple[_Call, Served]:
        """Parses and serves a call; `hints` gives the body's session hint and metadata."""
        agent = gate.agent_of(request)
        with gate.admitted(agent):
            req, size = await gate.parse_sized_body(request, model)
            user, metadata = hints(agent, req)
            return req, await _counted(service, run(call_context(request, agent, user, metadata, size), req))

    return served


def _call_routes(service: AdapterService, gate: RequestGate) -> APIRouter:
    """The model and the OpenAI call shapes (chat, text/token completions, token-in/token-out)."""
    router = APIRouter()
    served = _server(service, gate)

    @router.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "draining": service.book.draining,
                "usable_resources": len(service.routing.usable_ids())}

    @router.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        gate.agent_of(request)
        return {"object": "list", "data": [
            {"id": service.config.model_name, "object": "model", "created": 0, "owned_by": "seamlessflow",
             "max_model_len": service.context_tokens},
        ]}

    @router.post("/v1/chat/completions", response_model=None, openapi_extra=body_doc(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        req, call = await served(request, ChatCompletionRequest, service.chat)
        return _respond(call, req, outputs.chat_chunks, outputs.chat_completion)

    @router.post("/v1/completions", response_model=None, openapi_extra=body_doc(CompletionRequest))
    async def completions(request: Request) -> Response:
        req, call = await served(request, CompletionRequest, service.complete)
        return _respond(call, req, outputs.text_chunks, outputs.text_completion)

    @router.post("/v1/generate", response_model=None, openapi_extra=body_doc(TokenGenerateRequest))
    async def generate(request: Request) -> Response:
        req, call = await served(request, TokenGenerateRequest, service.generate)
        return JSONResponse(_generate_body(call, req), headers={"X-Session-Id": call.session_id})

    return router


def _translated_routes(service: AdapterService, gate: RequestGate) -> APIRouter:
    """OpenAI's Responses and Anthropic's Messages APIs, translated onto the chat pipeline."""
    router = APIRouter()
    served = _server(service, gate)
    responses_api, messages_api = ResponsesApi(service, gate.limits), MessagesApi(service, gate.limits)

    def answer(body: dict[str, Any], events: Callable[[dict[str, Any]], list[tuple[str, dict[str, Any]]]],
               stream: bool, session_id: str) -> Response:
        if not stream:
            return JSONResponse(body, headers={"X-Session-Id": session_id})
        return _event_stream(events(body), session_id)

    @router.post("/v1/responses", response_model=None, openapi_extra=body_doc(ResponsesRequest))
    async def responses(request: Request) -> Response:
        req, call = await served(request, ResponsesRequest, responses_api.serve, responses_api.session_hints)
        return answer(response_body(req, call), response_events, req.stream, call.session_id)

    @router.post("/v1/messages", response_model=None, openapi_extra=body_doc(MessagesRequest))
    async def messages(request: Request) -> Response:
        req, call = await served(request, MessagesRequest, messages_api.serve, messages_api.session_hints)
        return answer(message_body(service.codec, req, call), message_events, req.stream, call.session_id)

    return router


def _session_routes(book: SessionBook, gate: RequestGate) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/sessions/{session_id}")
    async def session_info(session_id: str, request: Request) -> dict[str, Any]:
        return book.session_info(gate.agent_of(request), session_id)

    @router.post("/v1/sessions/{session_id}/end", response_model=None, openapi_extra=body_doc(EndSessionRequest))
    async def end_session(session_id: str, request: Request) -> Response:
        agent = gate.agent_of(request)
        req, _ = await gate.parse_sized_body(request, EndSessionRequest)
        result = await book.end_session(agent, session_id, req.reward, req.status,
                                        task_id=request.headers.get("x-task-id", ""),
                                        group_id=request.headers.get("x-group-id", ""))
        return JSONResponse(result, status_code=202 if req.reward is None else 200)

    @router.post("/v1/sessions/{session_id}/reward", openapi_extra=body_doc(RewardRequest))
    async def report_reward(session_id: str, request: Request) -> dict[str, Any]:
        agent = gate.agent_of(request)
        req, _ = await gate.parse_sized_body(request, RewardRequest)
        return await book.report_reward(agent, session_id, req.reward, req.status)

    return router


def _admin_routes(service: AdapterService, gate: RequestGate) -> APIRouter:
    router = APIRouter()

    @router.get("/admin/stats")
    async def admin_stats(request: Request) -> dict[str, Any]:
        gate.require_admin(request)
        return service.stats() | {"config": service.config.redacted()}

    @router.post("/admin/drain", openapi_extra=body_doc(DrainRequest))
    async def admin_drain(request: Request) -> dict[str, Any]:
        gate.require_admin(request)
        req, _ = await gate.parse_sized_body(request, DrainRequest)
        return await service.book.drain(req.stop_accepting, req.timeout_s, req.end_sessions)

    return router


# ----- responses


async def _counted(service: AdapterService, call: Awaitable[Served]) -> Served:
    """Awaits a call, counting failures by error code for /admin/stats."""
    try:
        served = await call
    except ProxyError as e:
        service.requests_failed[e.code or type(e).__name__] += 1
        raise
    return served


def _respond(served: Served, req: _Sampled, chunks: Callable[..., list[dict[str, Any]]],
             body: Callable[..., dict[str, Any]]) -> Response:
    """The OpenAI body, or its SSE chunks: all sent at once (the call is already recorded)."""
    headers = {"X-Session-Id": served.session_id}
    shown = (served.response_id, req.model, served.replies, served.prompt_tokens, served.logprobs)
    if not req.stream:
        return JSONResponse(body(*shown, served.extra), headers=headers)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    events = chunks(*shown, include_usage, served.extra)
    payload = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in events) + b"data: [DONE]\n\n"
    return _streamed(payload, served.session_id)


def _event_stream(events: list[tuple[str, dict[str, Any]]], session_id: str) -> Response:
    """Typed SSE events (`event:` + `data:` lines), as the Responses and Messages APIs stream."""
    return _streamed(b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events),
                     session_id)


def _streamed(payload: bytes, session_id: str) -> Response:
    """An SSE answer sent at once: the call is already recorded."""

    async def sse() -> AsyncIterator[bytes]:
        yield payload

    return StreamingResponse(sse(), media_type="text/event-stream", headers={"X-Session-Id": session_id})


def _generate_body(served: Served, req: TokenGenerateRequest) -> dict[str, Any]:
    """SGLang's /generate answer, with the session's turn, drift and parent call."""
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
    return {"text": reply.text, "output_ids": call.output_ids, "meta_info": meta}
