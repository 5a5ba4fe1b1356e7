"""What the capture proxy reads from an HTTP request, in the order agents expect its checks.

Key (401), requests in flight of the agent (429), size (413), UTF-8 / depth / surrogates / number
ranges (400) and JSON (422) (the guard every service shares, `bus.http`, its refusals converted to
`ProxyError`s here), fields (400); the model (404) and the session's owner (403) are the service's.
Bodies are parsed here, not by FastAPI's signature binding, so that this order holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from agents_adapter.errors import (
    AuthenticationError,
    InvalidBodyError,
    InvalidParameterError,
    MalformedRequestError,
    PayloadTooLargeError,
    RateLimitedError,
)
from agents_adapter.proxy.config import AdapterConfig, hash_api_key
from agents_adapter.proxy.openai_models import BodyLimits
from agents_adapter.proxy.service import CallContext
from bus.http import (
    BodyRefused,
    BodyTooLarge,
    MalformedJson,
    describe_validation_errors,
    parse_json_body,
    read_capped,
    refuse_declared_size,
)

_M = TypeVar("_M", bound=BaseModel)
_SESSION_ID = re.compile(r"^[\x21-\x7e]{1,256}$")
_PARSE_INLINE_BYTES = 64 * 1024  # larger bodies are parsed on a worker thread, off the event loop


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused (413) as soon as it is known to be over `max_bytes`; the rest is not read."""
    try:
        refuse_declared_size(request.headers.get("content-length"), max_bytes)
        return await read_capped(request.stream(), max_bytes)
    except BodyTooLarge as e:
        raise PayloadTooLargeError(str(e)) from e


def read_json(raw: bytes, max_depth: int) -> dict[str, Any]:
    """A JSON object that every later step can handle (`bus.http.parse_json_body`, numbers strict); an
    empty body is one without fields. Raises a 400 / 422 `ProxyError`."""
    try:
        data = parse_json_body(raw or b"{}", max_depth, strict_numbers=True)
    except MalformedJson as e:
        raise MalformedRequestError(str(e), param=e.param) from e
    except BodyRefused as e:
        raise InvalidBodyError(str(e), param=e.param) from e
    if not isinstance(data, dict):
        raise InvalidParameterError(f"the body must be a JSON object, got {type(data).__name__}")
    return data


def validate_body(raw: bytes, model: type[_M], max_depth: int, limits: BodyLimits) -> _M:
    """The body as `model`, after `read_json`; config-dependent field limits come in as the context."""
    return validate_fields(read_json(raw, max_depth), model, limits)


def validate_fields(data: dict[str, Any], model: type[_M], limits: BodyLimits) -> _M:
    """Fields as `model`, a failure as the 400 naming them: a body, or one translated from another API's."""
    try:
        return model.model_validate(data, context=limits)
    except ValidationError as e:
        message, param = describe_validation_errors(e.errors())
        raise InvalidParameterError(message, param=param) from e


def _bearer(request: Request) -> str:
    """The key: `Authorization: Bearer <key>`, or Anthropic's `x-api-key: <key>` when there is no
    Authorization header (Anthropic clients send one or the other)."""
    header = request.headers.get("authorization", "")
    api_key = request.headers.get("x-api-key", "").strip()
    if not header and api_key:
        return api_key
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError(
            "You didn't provide an API key: send 'Authorization: Bearer <key>'"
        )
    return token.strip()


def _printable(name: str, value: str) -> str:
    if not _SESSION_ID.match(value):
        raise InvalidParameterError(f"{name} must be 1-256 printable ASCII characters without spaces", param=name)
    return value


def call_context(request: Request, agent_id: str, user: str | None, metadata: dict[str, str] | None,
                 body_bytes: int = 0) -> CallContext:
    """Session id: header `X-Session-Id`, else the body's `user`, else a fresh `anon-...` id (a one-call
    session); task and group: headers `X-Task-Id` / `X-Group-Id`, else `metadata.task_id` / `group_id`;
    the client's `Idempotency-Key` (the SDK sends one per call, the same on each retry of it)."""
    session_id = request.headers.get("x-session-id") or user or f"anon-{uuid.uuid4().hex}"
    _printable("X-Session-Id", session_id)
    key = request.headers.get("idempotency-key", "")
    meta = dict(metadata or {})
    return CallContext(
        agent_id=agent_id,
        session_id=session_id,
        task_id=request.headers.get("x-task-id") or meta.get("task_id", ""),
        group_id=request.headers.get("x-group-id") or meta.get("group_id", ""),
        metadata=meta,
        request_key=_printable("Idempotency-Key", key) if key else "",
        body_bytes=body_bytes,
    )


class RequestGate:
    """Who may call (agent and admin keys), how many requests each agent has in flight, and bodies."""

    def __init__(self, config: AdapterConfig) -> None:
        self.config = config
        self.limits = config.body_limits()
        self.inflight_by_agent: Counter[str] = Counter()

    def agent_of(self, request: Request) -> str:
        agent = self.config.agent_keys.get(hash_api_key(_bearer(request)))
        if agent is None:
            raise AuthenticationError("Incorrect API key provided")
        return agent

    def require_admin(self, request: Request) -> None:
        digest = hash_api_key(_bearer(request))
        expected = self.config.admin_key_sha256
        if expected is None or not hmac.compare_digest(digest, expected):
            raise AuthenticationError("this endpoint needs the admin key")

    @contextlib.contextmanager
    def admitted(self, agent: str) -> Iterator[None]:
        """At most max_inflight_per_agent call requests per agent (one agent cannot starve the others)."""
        limit, inflight = self.config.max_inflight_per_agent, self.inflight_by_agent
        if inflight[agent] >= limit:
            raise RateLimitedError(
                f"agent {agent!r} has {inflight[agent]} requests in flight; "
                f"this proxy serves at most max_inflight_per_agent={limit} at once per agent",
                retry_after_s=self.config.retry_after_s,
            )
        inflight[agent] += 1
        try:
            yield
        finally:
            inflight[agent] -= 1
            if not inflight[agent]:
                del inflight[agent]

    async def parse_sized_body(self, request: Request, model: type[_M]) -> tuple[_M, int]:
        """The body as `model`, and its size in bytes (what decides whether its prompt is built off the loop)."""
        raw = await read_body(request, self.config.max_body_bytes)
        depth = self.config.max_json_depth
        if len(raw) <= _PARSE_INLINE_BYTES:
            return validate_body(raw, model, depth, self.limits), len(raw)
        return await asyncio.to_thread(validate_body, raw, model, depth, self.limits), len(raw)
