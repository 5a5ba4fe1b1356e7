"""Runs one LLM call on the rollout resources until it finishes: the proxy's long request.

The call is held open across everything the resources go through (docs/architecture.md, "Partial rollout"):
- weight sync (PauseRollout in_place): the engine keeps the request and continues it with the new
  weights; nothing to do here but wait (per-token versions show the swap);
- preemption (finish_reason abort with a partial output): continue on another usable resource from
  prompt + partial output with the remaining budget (`stitching.StitchedCall`);
- engine death or refused connection (or a 503: the engine says it cannot serve now): mark the
  resource unreachable for a cooldown and continue elsewhere (a dead engine's partial output never
  reached us, so its run counts 0 tokens);
- another 5xx answer (or an answer that breaks the protocol): the engine is up but failed this call.
  It is not marked unreachable (one bad call must not take an engine away from every agent); the call
  tries another engine, and fails (503) after `max_engine_errors` such answers instead of coming back
  to the same engine until its deadline;
- a 4xx answer: the request is at fault, not the engine: a 400 to the agent at once, no retry, no mark;
- no usable resource (every one paused, preempted or lost): wait for the routing table to change.
All of it is bounded by the call's deadline (long_request_timeout_s); past it the call fails with a
503 and the engine request is aborted, so the agent never gets a truncated answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace

from agents_adapter.errors import (
    EngineFailedError,
    EngineRejectedError,
    LongRequestTimeoutError,
    NoRolloutResourceError,
)
from agents_adapter.proxy.routing import Lease, RoutingTable
from agents_adapter.proxy.stitching import EngineRun, StitchedCall
from schemas.inference.client import InferenceClient
from schemas.inference.errors import InferenceHTTPError
from schemas.inference.protocol import SamplingParams

logger = logging.getLogger(__name__)
_WAIT_POLL_S = 0.25


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class EngineSampling:
    """Sampling of one call, the same for every run it is stitched from."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    json_schema: str | None = None  # the grammar the reply is decoded under (`constraints`), at most one
    regex: str | None = None
    ebnf: str | None = None

    def greedy_below(self, floor: float) -> EngineSampling:
        """Temperatures in (0, floor) as 0: logits divided by 1e-39 overflow to inf and the engine's
        probabilities (and logprobs) become NaN; greedy is what such a temperature means anyway."""
        return replace(self, temperature=0.0) if 0.0 < self.temperature < floor else self

    def for_choice(self, choice: int) -> EngineSampling:
        """Choice i of a seeded request samples with seed + i (n identical samples would be useless)."""
        return self if self.seed is None or choice == 0 else replace(self, seed=self.seed + choice)

    def params(self, max_new_tokens: int, generated: int = 0) -> SamplingParams:
        """`generated`: tokens of this call already generated (by earlier runs): a constrained run goes on
        from the grammar state they reached."""
        constrained = any(g is not None for g in (self.json_schema, self.regex, self.ebnf))
        return SamplingParams(
            max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            sampling_seed=self.seed, stop_token_ids=list(self.stop_token_ids) or None, ignore_eos=self.ignore_eos,
            json_schema=self.json_schema, regex=self.regex, ebnf=self.ebnf,
            grammar_prefix_tokens=generated if constrained and generated else None,
        )


@dataclass
class _Attempts:
    """What one call learned about the engines it ran on."""

    avoid: dict[str, int] = field(default_factory=dict)  # resource id -> epoch when the call left it
    failed_answers: int = 0


def _engine_unavailable(error: InferenceHTTPError) -> bool:
    """No answer at all (connection refused, dropped, timed out) or the engine's own 503."""
    return error.error_type == "connection_error" or error.status_code == 503


class Dispatcher:
    """Engine clients (one per endpoint, pooled) and the resume loop."""

    def __init__(self, routing: RoutingTable, *, request_timeout_s: float, max_segments: int,
                 max_connections: int, avoid_grace_s: float = 1.0, max_engine_errors: int = 2,
                 greedy_below_temperature: float = 0.0) -> None:
        self.routing = routing
        self.request_timeout_s = request_timeout_s
        self.max_segments = max_segments
        self.max_connections = max_connections
        self.avoid_grace_s = avoid_grace_s
        self.max_engine_errors = max_engine_errors
        self.greedy_below_temperature = greedy_below_temperature
        self._clients: dict[str, InferenceClient] = {}
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.resumed_calls = 0
        self.engine_failures = 0

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wakes waiting calls on `loop` whenever the routing table changes (from any thread)."""
        self._loop = loop
        self.routing.subscribe(self._changed_threadsafe)

    def _changed_threadsafe(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def client(self, endpoint: str) -> InferenceClient:
        client = self._clients.get(endpoint)
        if client is None:
            client = InferenceClient(endpoint, timeout_s=self.request_timeout_s, max_connections=self.max_connections)
            self._clients[endpoint] = client
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()

    async def run(self, call_id: str, session_id: str, prompt_ids: list[int], max_new_tokens: int,
                  sampling: EngineSampling, deadline: float) -> StitchedCall:
        """The call's output, stitched over as many runs as it took; raises a `ProxyError` otherwise."""
        stitched = StitchedCall(list(prompt_ids), max_new_tokens)
        sampling = sampling.greedy_below(self.greedy_below_temperature)
        attempts = _Attempts()
        while not stitched.finished:
            if len(stitched.segments) >= self.max_segments:
                raise EngineFailedError(
                    f"call {call_id} did not finish in {self.max_segments} engine runs (max_segments): "
                    + ", ".join(f"{s.resource_id}:{s.finish_reason}" for s in stitched.segments)
                )
            lease = await self._lease(session_id, attempts.avoid, deadline)
            await self._run_once(call_id, stitched, lease, sampling, deadline, attempts)
        if stitched.resumed:
            self.resumed_calls += 1
            logger.info("call stitched", extra={"call": call_id, "session": session_id,
                                                "segments": len(stitched.segments)})
        return stitched

    async def _run_once(self, call_id: str, stitched: StitchedCall, lease: Lease, sampling: EngineSampling,
                        deadline: float, attempts: _Attempts) -> None:
        rid = f"{call_id}-{len(stitched.segments)}"
        client = self.client(lease.endpoint)
        started = now_ms()
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            async with asyncio.timeout(remaining):  # not wait_for: no second task per engine request
                params = sampling.params(stitched.remaining, len(stitched.output_ids))
                response = await client.generate(stitched.next_input_ids(), params, rid=rid)
        except TimeoutError as e:
            self._abort_later(client, rid)
            raise LongRequestTimeoutError(
                f"the call was not finished within long_request_timeout_s={self.request_timeout_s}s "
                f"(last engine: {lease.resource_id}); nothing was served"
            ) from e
        except asyncio.CancelledError:
            self._abort_later(client, rid)
            raise
        except InferenceHTTPError as e:
            if 400 <= e.status_code < 500:
                raise EngineRejectedError(f"the engine refused the request: {e.message}") from e
            self._failed(call_id, stitched, lease, started, attempts, e.status_code, e.message,
                         unavailable=_engine_unavailable(e))
            return
        except ValueError as e:  # a 200 whose body is not a GenerateResponse: the engine broke the protocol
            self._failed(call_id, stitched, lease, started, attempts, 200, f"unreadable answer: {e}",
                         unavailable=False)
            return
        finally:
            self.routing.release(lease)
        try:
            version = int(response.meta_info.weight_version or -1)
        except ValueError:
            version = -1
        run = EngineRun(response.output_ids, response.token_logprobs(), response.token_versions(),
                        response.finish_type or "", version)
        stitched.add(lease.resource_id, run, started, now_ms())
        if run.finish == "abort":
            attempts.avoid[lease.resource_id] = lease.epoch
            logger.info("call preempted", extra={"call": call_id, "resource": lease.resource_id,
                                                 "tokens": len(run.output_ids)})

    def _failed(self, call_id: str, stitched: StitchedCall, lease: Lease, started: int, attempts: _Attempts,
                status: int, message: str, *, unavailable: bool) -> None:
        """Records a run that served nothing; raises once the engines answered errors too often."""
        self.engine_failures += 1
        stitched.add_failure(lease.resource_id, -1, started, now_ms())
        logger.warning("engine failed mid-call", extra={"call": call_id, "resource": lease.resource_id,
                                                        "status": status, "error": message[:200]})
        if unavailable:
            self.routing.mark_unreachable(lease.resource_id)
            return
        attempts.failed_answers += 1
        attempts.avoid[lease.resource_id] = lease.epoch
        if attempts.failed_answers >= self.max_engine_errors:
            raise EngineFailedError(
                f"call {call_id}: the engines answered errors {attempts.failed_answers} times "
                f"(last: HTTP {status} from {lease.resource_id}; max_engine_errors_per_call={self.max_engine_errors}); "
                "it is not sent again"
            )

    async def _lease(self, session_id: str, avoid: dict[str, int], deadline: float) -> Lease:
        """A usable resource, waiting (bounded by the deadline) while there is none."""
        waited_since = time.monotonic()
        while True:
            allow_avoided = time.monotonic() - waited_since >= self.avoid_grace_s
            lease = self.routing.acquire(session_id, avoid, allow_avoided=allow_avoided)
            if lease is not None:
                return lease
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoRolloutResourceError(
                    f"no rollout resource took the call within long_request_timeout_s={self.request_timeout_s}s "
                    f"({self.routing.describe_unavailable()}); nothing was served"
                )
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, _WAIT_POLL_S))

    def _abort_later(self, client: InferenceClient, rid: str) -> None:
        async def abort() -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.abort(rid), 5.0)

        task = asyncio.get_running_loop().create_task(abort())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
