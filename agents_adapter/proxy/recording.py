"""The record of what the proxy served: LLMCall, SessionStarted and SessionEnded events.

A call counts as served only once Kafka acknowledged all its events (acks=all, idempotent producer):
the proxy answers the agent after `Recorder.record` returned, and answers 503 when it raised. A call's
events are published together (its LLMCall, and SessionStarted with a session's first call), and one
of them may be acknowledged while another times out (a broker of three died: the partitions it led
move to another broker within seconds). Answering 503 then would leave a recorded call the agent was
told failed (it calls again, and the processor finds a call its session never counted), so the events
Kafka did not acknowledge are published again, the acknowledged ones not, until all are or
`record_retry_s` has passed. The producer's delivery timeout is short (config
`delivery_timeout_ms`), so each attempt ends within seconds; an event that timed out may still have
been stored (librdkafka's "possibly persisted"), which consumers absorb by its event id.

Session events have deterministic ids (uuid5 of the session), so a SessionStarted sent again after
the session cache forgot a session, or a repeated SessionEnded, is one event to deduplicating consumers.
An LLMCall's event id is its call id.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Final

from agents_adapter.errors import RecordingError
from agents_adapter.proxy.session_cache import SessionState
from agents_adapter.proxy.stitching import StitchedCall
from bus.errors import BusError
from bus.producer import EventProducer
from schemas.events import Event, LLMCall, SessionEnded, SessionStarted, SessionStatus
from schemas.packed import Float32s, Int32s

logger = logging.getLogger(__name__)
SESSION_NAMESPACE: Final = uuid.UUID("0d6b6c1e-9a43-5f7e-8a53-2b1f2c0e7a11")
_RETRY_PAUSE_S: Final = 0.5  # between attempts: a moved partition leader is found by a metadata refresh


def session_event_id(kind: str, session_id: str) -> str:
    return uuid.uuid5(SESSION_NAMESPACE, f"{kind}/{session_id}").hex


def session_started(state: SessionState, producer: str) -> SessionStarted:
    return SessionStarted(
        event_id=session_event_id("SessionStarted", state.session_id), producer=producer,
        correlation_id=state.session_id, session_id=state.session_id, agent_id=state.agent_id,
        task_id=state.task_id, group_id=state.group_id, metadata=dict(state.metadata),
    )


def session_ended(state: SessionState, reward: float, status: SessionStatus, producer: str) -> SessionEnded:
    return SessionEnded(
        event_id=session_event_id("SessionEnded", state.session_id), producer=producer,
        correlation_id=state.session_id, session_id=state.session_id, agent_id=state.agent_id,
        task_id=state.task_id, group_id=state.group_id, reward=float(reward), status=status,
        num_calls=state.calls_served,
    )


def llm_call(*, call_id: str, state: SessionState, model: str, turn: int, call: StitchedCall, request_ms: int,
             completed_ms: int, drift: bool, parent_call_id: str, producer: str) -> LLMCall:
    return LLMCall(
        event_id=call_id, producer=producer, correlation_id=state.session_id, call_id=call_id,
        session_id=state.session_id, agent_id=state.agent_id, task_id=state.task_id, group_id=state.group_id,
        model=model, turn=turn, prompt_ids=Int32s(call.prompt_ids), output_ids=Int32s(call.output_ids),
        output_logprobs=Float32s(call.logprobs), output_versions=Int32s(call.versions),
        finish_reason=call.finish_reason, segments=tuple(call.segments), request_ms=request_ms,
        completed_ms=completed_ms, drift=drift, parent_call_id=parent_call_id,
    )


class Recorder:
    """Publishes events and waits for Kafka's acknowledgement of every one of them."""

    def __init__(self, producer: EventProducer, ack_timeout_s: float, retry_s: float = 0.0) -> None:
        self.producer = producer
        self.ack_timeout_s = ack_timeout_s
        self.retry_s = retry_s
        self.recorded = 0
        self.failed = 0
        self.retried = 0

    async def record(self, events: Sequence[Event]) -> None:
        """Returns once Kafka stored all `events`; raises `RecordingError` (503) otherwise."""
        deadline = time.monotonic() + self.retry_s
        pending, attempt = list(events), 1
        while failures := await self._publish(pending):
            error = failures[0][1]
            kinds = ", ".join(sorted({e.event_type for e, _ in failures}))
            if time.monotonic() + _RETRY_PAUSE_S > deadline:
                self.failed += len(events)
                logger.error("recording failed",
                             extra={"events": kinds, "attempts": attempt, "error": str(error)[:200]})
                raise RecordingError(
                    f"Kafka did not acknowledge the call's record ({kinds}) in {attempt} attempt(s) of "
                    f"{self.ack_timeout_s:.1f}s; the call was not served"
                ) from error
            logger.warning("recording: publishing again what Kafka did not acknowledge",
                           extra={"events": kinds, "attempt": attempt, "error": str(error)[:200]})
            await asyncio.sleep(_RETRY_PAUSE_S)
            pending, attempt = [e for e, _ in failures], attempt + 1
            self.retried += len(pending)
        self.recorded += len(events)

    async def _publish(self, events: Sequence[Event]) -> list[tuple[Event, BaseException]]:
        """The events Kafka did not acknowledge, with why (all of them when the wait itself timed out)."""
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(self.producer.publish_async(e) for e in events), return_exceptions=True),
                self.ack_timeout_s,
            )
        except TimeoutError as e:
            return [(event, e) for event in events]
        failures = [(event, r) for event, r in zip(events, results, strict=True) if isinstance(r, BaseException)]
        for _, error in failures:
            if not isinstance(error, BusError):
                raise error  # not Kafka's answer (an event that cannot be encoded): no retry helps
        return failures

    def close(self, timeout_s: float = 5.0) -> None:
        try:
            self.producer.close(timeout_s)
        except BusError as e:
            logger.warning("producer closed with undelivered events: %s", e)
