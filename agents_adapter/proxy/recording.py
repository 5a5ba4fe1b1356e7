"""The record of what the proxy served: LLMCall, SessionStarted and SessionEnded events.

A call counts as served only once Kafka acknowledged all its events (acks=all, idempotent producer):
the proxy answers the agent after `Recorder.record` returned, and answers 503 when it raised. A call's
events go together (its LLMCall, and SessionStarted with a session's first call), and one of them may
be stored while another is not yet (a broker of three died: the partitions it led move to another
broker, in seconds, longer on a loaded machine). The producer retries each event itself until
`delivery_timeout_ms` (30 s), and its retries are idempotent (the broker drops a resent copy), so a
failover within that time costs latency, never a 503 with half a record stored or a second copy.
Publishing an event again after it timed out would not be safe: librdkafka cannot tell whether a
timed-out event was stored ("possibly persisted"), and a copy would be a call recorded twice.
What remains: Kafka away longer than the timeout while one event of a call was stored leaves a
recorded call its agent was told failed (the trajectory processor dead-letters it, naming why).

After a crash the same holds for what the dead process published without learning its fate: the
session store kept those events un-acknowledged, and `Recorder.ids_on_log` reads the log back from
their time so that only the events Kafka does not hold yet are published again (`SessionBook.
republish`). Republishing blindly would put a second copy of a call on `llm.calls` whenever the
crash fell between Kafka's acknowledgement and the store's note of it.

Session events have deterministic ids (uuid5 of the session), so a SessionStarted sent again after
the session cache forgot a session, or a repeated SessionEnded, is one event to deduplicating consumers.
An LLMCall's event id is its call id.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from typing import Final

from agents_adapter.errors import RecordingError
from agents_adapter.proxy.session_cache import SessionState
from agents_adapter.proxy.stitching import StitchedCall
from agents_adapter.proxy.tito import BuiltPrompt
from bus.errors import BusError
from bus.producer import EventProducer
from bus.replay import ReplayRange, replay
from bus.topics import topic_of
from schemas.events import Event, LLMCall, SessionEnded, SessionStarted, SessionStatus, encode_event
from schemas.packed import Float32s, Int32s
from schemas.prompt_refs import by_reference, longest_shared

logger = logging.getLogger(__name__)
SESSION_NAMESPACE: Final = uuid.UUID("0d6b6c1e-9a43-5f7e-8a53-2b1f2c0e7a11")
# How far before an event's own time its message may carry a timestamp: the producer stamps it after
# the event was built (on the same clock), a broker with LogAppendTime stamps it later still; the margin
# only covers clock skew between this host and the brokers.
LOG_LOOKBACK_MS: Final = 60_000


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


def on_the_wire(events: Sequence[Event], stored: Sequence[bytes], prompts: Sequence[BuiltPrompt],
                state: SessionState) -> list[bytes]:
    """What `llm.calls` gets: a call whose prompt begins with a recorded call's ids by reference to it
    (`schemas.prompt_refs`), any other event as stored. The store keeps the full form: what it restores (a
    session's prompt cache, a retried request's answer) needs no resolution, and a republished event is valid."""
    calls = len(prompts)
    out = list(stored[:len(stored) - calls])
    for event, value, prompt in zip(events[len(events) - calls:], stored[len(stored) - calls:], prompts, strict=True):
        if isinstance(event, LLMCall):
            base, shared = wire_base(event, prompt, state)
            value = encode_event(by_reference(event, base, shared)) if shared else value
        out.append(value)
    return out


def wire_base(call: LLMCall, prompt: BuiltPrompt, state: SessionState) -> tuple[str, int]:
    """The recorded call whose ids begin this call's prompt, and how many: the parent, all of its prompt+output,
    for an extension (token-in/token-out); else, for a fork (an agent that rewrote or truncated its history),
    the call of the session's prompt cache sharing the longest prefix. Never a call whose event the log may not
    hold yet (`SessionState.unlogged`: restored after a crash, republished by the recovery)."""
    if prompt.parent_call_id and prompt.parent_call_id not in state.unlogged and \
            0 < prompt.reused_tokens <= call.prompt_len:
        return prompt.parent_call_id, prompt.reused_tokens
    cached = (*state.chat_calls.values(), *state.text_calls.values(), *state.token_calls.values())
    return longest_shared(call, ((c.call_id, c.ids) for c in cached if c.call_id not in state.unlogged))


class Recorder:
    """Publishes events and waits for Kafka's acknowledgement of every one of them."""

    def __init__(self, producer: EventProducer, ack_timeout_s: float) -> None:
        self.producer = producer
        self.ack_timeout_s = ack_timeout_s
        self.recorded = 0
        self.failed = 0
        self.awaiting = 0  # events published and not acknowledged yet

    async def record(self, events: Sequence[Event], encoded: Sequence[bytes] | None = None) -> None:
        """Returns once Kafka stored all `events` (`encoded`: their encoding, when the caller has it);
        raises `RecordingError` (503) otherwise."""
        self.awaiting += len(events)
        values = encoded if encoded is not None else [None] * len(events)
        try:
            async with asyncio.timeout(self.ack_timeout_s):
                await asyncio.gather(*(self.producer.publish_async(e, value=v)
                                       for e, v in zip(events, values, strict=True)))
        except (BusError, TimeoutError) as e:
            self.failed += len(events)
            kinds = ", ".join(sorted({e.event_type for e in events}))
            logger.error("recording failed", extra={"events": kinds, "error": str(e)[:200]})
            raise RecordingError(
                f"Kafka did not acknowledge the call's record ({kinds}) within {self.ack_timeout_s:.1f}s; "
                "the call was not served"
            ) from e
        finally:
            self.awaiting -= len(events)
        self.recorded += len(events)

    async def ids_on_log(self, events: Sequence[Event]) -> set[str]:
        """The ids of those of `events` that their topics already hold (read back from the events' time).

        Raises `RecordingError` when the log cannot be read: publishing without knowing could double a call."""
        if not events:
            return set()
        topics = sorted({topic_of(type(e)).name for e in events})
        since = min(e.ts_ms for e in events) - LOG_LOOKBACK_MS
        wanted = {e.event_id for e in events}
        try:
            read = await asyncio.to_thread(replay, self.producer.config, topics, ReplayRange(start_ms=since))
        except BusError as e:
            raise RecordingError(f"the log could not be read back to find what a crash left published: {e}") from e
        return {r.event.event_id for r in read.events} & wanted

    def close(self, timeout_s: float = 5.0) -> None:
        try:
            self.producer.close(timeout_s)
        except BusError as e:
            logger.warning("producer closed with undelivered events: %s", e)
