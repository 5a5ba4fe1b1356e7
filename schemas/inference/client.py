"""Async HTTP client of SGLang's native API, for the native engine's app and for SGLang itself.

`InferenceClient` is what the agents adapter uses (token-in / token-out `generate`, plus the control
calls). `RemoteEngineControl` gives the synchronous `EngineControl` surface the controller drives
(pause / resume / load weights / abort) for an engine that lives in another process, by running the
async client on a private event-loop thread.

Every request carries `Authorization: Bearer <key>` when a control key is known: the `control_key`
argument, else `$SFLOW_INFERENCE_KEY` (the variable the service reads too), so callers that share the
service's environment (the proxy, the tests, RemoteEngineControl) need no change. SGLang launched with
`--api-key` checks the same header.

HTTP is a keep-alive HTTP/1.1 client of our own (`schemas.inference.http11`): the proxy makes one engine
request per call, and httpx's stack cost ~1.4 ms of CPU per call, aiohttp's ~0.8 ms (bench/adapter_bench.py's
profile, docs/architecture.md, "The hot path, as built").
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from schemas.inference.control import EngineControl, control_key_from_env
from schemas.inference.errors import InferenceHTTPError
from schemas.inference.http11 import Http11Client
from schemas.inference.protocol import (
    ControlResponse,
    GenerateRequest,
    GenerateResponse,
    ModelInfoResponse,
    SamplingParams,
    UpdateWeightsFromDiskResponse,
)
from schemas.inference.types import EngineStats, WeightUpdateResult

_T = TypeVar("_T")
# idle connections are dropped before uvicorn's 5 s keep-alive (the engine's, SGLang's) closes them: a
# request sent on a connection the server is closing would fail as a connection error
_KEEPALIVE_S = 4.0


def generate_payload(
    input_ids: list[int],
    sampling_params: SamplingParams | dict[str, Any] | None = None,
    *,
    rid: str | None = None,
    return_logprob: bool = True,
) -> dict[str, Any]:
    """The /generate JSON body, validated by our protocol model (the same body SGLang accepts)."""
    params = (
        sampling_params
        if isinstance(sampling_params, SamplingParams)
        else SamplingParams(**(sampling_params or {}))
    )
    if params.seed is not None:  # SGLang only knows sampling_seed
        params = params.model_copy(update={"sampling_seed": params.seed, "seed": None})
    request = GenerateRequest(input_ids=input_ids, sampling_params=params, rid=rid, return_logprob=return_logprob)
    return request.model_dump(exclude_none=True, exclude_defaults=True) | {"input_ids": input_ids}


@dataclass(frozen=True)
class _Reply:
    """A read HTTP response: status and body (the connection is back in the pool)."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


class InferenceClient:
    """One inference server (native or SGLang) at `base_url`.

    The connection pool is bound to the event loop of the first request (`RemoteEngineControl` builds the
    client outside its loop)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        max_connections: int = 100,
        control_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if control_key is None:
            from_env = control_key_from_env()
            control_key = None if from_env is None else from_env.get_secret_value()
        headers = {"Authorization": f"Bearer {control_key}"} if control_key else {}
        self._http = Http11Client(self.base_url, headers=headers, timeout_s=timeout_s,
                                  max_connections=max_connections, keepalive_s=_KEEPALIVE_S)

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.close()

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> _Reply:
        data = None if body is None else orjson.dumps(body)  # the same JSON as json.dumps (compact), faster
        status, content = await self._http.request(method, path, data)
        return _Reply(status, content)

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> _Reply:
        try:
            response = await self._request(method, path, body)
        except (OSError, TimeoutError) as e:  # TimeoutError: the client's own timeout_s, not a caller's
            raise InferenceHTTPError(503, "connection_error", f"{method} {self.base_url}{path}: {e!r}") from e
        if response.status_code >= 400:
            raise _http_error(response)
        return response

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: SamplingParams | dict[str, Any] | None = None,
        *,
        rid: str | None = None,
        return_logprob: bool = True,
    ) -> GenerateResponse:
        """Token-in / token-out generation. finish_type 'abort' carries the partial output."""
        payload = generate_payload(input_ids, sampling_params, rid=rid, return_logprob=return_logprob)
        response = await self._call("POST", "/generate", payload)
        return GenerateResponse.model_validate_json(response.content)

    async def pause(self, mode: str = "abort") -> ControlResponse:
        response = await self._call("POST", "/pause_generation", {"mode": mode})
        return ControlResponse.model_validate(response.json())

    async def resume(self) -> ControlResponse:
        response = await self._call("POST", "/continue_generation", {})
        return ControlResponse.model_validate(response.json())

    async def update_weights_from_disk(
        self,
        model_path: Path | str,
        weight_version: int | None = None,
        *,
        abort_all_requests: bool = False,
        sha256: str | None = None,
    ) -> UpdateWeightsFromDiskResponse:
        """`sha256` is our extension (the native app checks it); leave it None for SGLang."""
        body: dict[str, Any] = {"model_path": str(model_path), "abort_all_requests": abort_all_requests}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        if sha256 is not None:
            body["sha256"] = sha256
        response = await self._call("POST", "/update_weights_from_disk", body)
        return UpdateWeightsFromDiskResponse.model_validate(response.json())

    async def abort(self, rid: str = "", *, abort_all: bool = False) -> int:
        """Number of requests aborted; -1 when the server does not say (SGLang answers an empty 200)."""
        response = await self._call("POST", "/abort_request", {"rid": rid, "abort_all": abort_all})
        try:
            return int(response.json()["num_aborted"])
        except (ValueError, KeyError, TypeError):
            return -1

    async def health(self) -> bool:
        try:
            response = await self._request("GET", "/health_generate")
        except (OSError, TimeoutError):
            return False
        return response.status_code == 200

    async def model_info(self) -> ModelInfoResponse:
        response = await self._call("GET", "/model_info")
        return ModelInfoResponse.model_validate(response.json())

    async def weight_version(self) -> str | None:
        return (await self.model_info()).weight_version

    async def engine_stats(self) -> dict[str, Any] | None:
        """Our extension (/engine_stats); None from a server without it (SGLang)."""
        try:
            response = await self._call("GET", "/engine_stats")
        except InferenceHTTPError as e:
            if e.status_code == 404:
                return None
            raise
        return dict(response.json())

    async def flush_cache(self) -> bool:
        try:
            await self._call("POST", "/flush_cache")
        except InferenceHTTPError as e:
            if e.status_code == 400:
                return False
            raise
        return True


def _http_error(response: _Reply) -> InferenceHTTPError:
    try:
        body = response.json()
    except ValueError:
        return InferenceHTTPError(response.status_code, "http_error", response.text[:500])
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        return InferenceHTTPError(response.status_code, str(error.get("type")), str(error.get("message")))
    if isinstance(body, dict) and "message" in body:
        return InferenceHTTPError(response.status_code, "http_error", str(body["message"]))
    return InferenceHTTPError(response.status_code, "http_error", str(body)[:500])


class RemoteEngineControl(EngineControl):
    """Synchronous `EngineControl` over HTTP (for the controller driving SGLang or a remote engine)."""

    def __init__(self, base_url: str, *, timeout_s: float = 600.0, control_key: str | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-control", daemon=True)
        self._thread.start()
        self._client = InferenceClient(base_url, timeout_s=timeout_s, control_key=control_key)
        self._last_version: int | None = None

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def pause(self, mode: str = "in_place") -> int:
        held = self._run(self._client.pause(mode)).num_requests
        return -1 if held is None else held

    def resume(self) -> None:
        self._run(self._client.resume())

    def update_weights_from_disk(
        self,
        model_path: Path | str,
        weight_version: int | None = None,
        *,
        abort_all_requests: bool = False,
        sha256: str | None = None,
    ) -> WeightUpdateResult:
        started = time.perf_counter()
        response = self._run(
            self._client.update_weights_from_disk(
                model_path, weight_version, abort_all_requests=abort_all_requests, sha256=sha256
            )
        )
        elapsed_ms = (time.perf_counter() - started) * 1000
        version = int(response.weight_version) if response.weight_version else (weight_version or -1)
        self._last_version = version
        return WeightUpdateResult(
            success=response.success,
            message=response.message,
            weight_version=version,
            load_ms=response.load_ms if response.load_ms is not None else elapsed_ms,
            apply_ms=response.apply_ms or 0.0,
            num_paused_requests=response.num_paused_requests,
        )

    def abort_all(self) -> int:
        return self._run(self._client.abort(abort_all=True))

    def stats(self) -> EngineStats:
        """What a Heartbeat reports; counts are -1 when the server (SGLang) does not expose them."""
        reported = self._run(self._client.engine_stats())
        if reported is not None:
            return EngineStats(**reported)
        return EngineStats(
            running=-1, queued=-1, paused=False, weight_version=self.weight_version, tokens_generated=-1,
            requests_finished=-1,
        )

    @property
    def weight_version(self) -> int:
        reported = self._run(self._client.weight_version())
        try:
            return int(reported or "")
        except ValueError:
            return self._last_version if self._last_version is not None else -1

    @property
    def is_alive(self) -> bool:
        """Until `close`: the remote engine's own health is its supervisor's to watch (its /health)."""
        return self._thread.is_alive()

    def close(self) -> None:
        self._run(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
