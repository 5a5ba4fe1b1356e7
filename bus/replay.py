"""Replay: read a topic range (offsets or time) back as decoded events, without a consumer group.

Operators use it to rebuild state (trajectories, the scheduler's pool) and compare it with what was
recorded. Events come back in offset order per partition and merged by timestamp across partitions,
so the order per key — what Kafka guarantees — is the order they were produced in.

An `LLMCall` recorded by reference (`schemas.prompt_refs`) comes back in full form, resolved from the
calls read before it in its partition (a session's calls share one); one whose base call is not in the
range (a range starting mid-session) is skipped with the reason, never guessed.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bus.config import BusConfig
from bus.consumer import Received, consumer_settings, fetch_ready, to_received, unique_group
from bus.errors import ConsumeError
from schemas.errors import SchemaError
from schemas.events import LLMCall
from schemas.prompt_refs import PromptResolver

log = logging.getLogger("sflow.bus")


@dataclass(frozen=True)
class ReplayRange:
    """Which part of the log to read: offsets (inclusive start, exclusive end) or event times (ms).

    Offsets apply to every partition; an unset bound means the start of the log or its end as
    it is when the replay begins (the replay never waits for new events).
    """

    start_offset: int | None = None
    end_offset: int | None = None
    start_ms: int | None = None
    end_ms: int | None = None


@dataclass
class ReplayResult:
    """Events read and the messages that could not be decoded (topic, partition, offset, reason)."""

    events: list[Received] = field(default_factory=list)
    skipped: list[tuple[str, int, int, str]] = field(default_factory=list)


_LEADER_MOVING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                            KafkaError.UNKNOWN_TOPIC_OR_PART})


def _watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
    """The partition's low and high offsets, asked again while the broker answers with a retriable error.

    Why: a broker that has not yet taken (or re-taken) leadership of a partition answers "not leader for
    partition" for a moment, e.g. on a loaded machine right after the topic was created; the client's
    metadata refresh then finds the leader. Seen in CI at load ~20 (tests/kafka/test_trainer_service.py).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
            return int(low), int(high)
        except KafkaException as e:
            error = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
            retriable = error is not None and (error.retriable() or error.code() in _LEADER_MOVING)
            if not retriable or time.monotonic() >= deadline:
                raise
            log.info("watermarks not available yet, asking again", extra={"topic": tp.topic, "error": str(error)})
            time.sleep(0.2)


def _bounds(consumer: Consumer, tp: TopicPartition, rng: ReplayRange, timeout_s: float) -> tuple[int, int]:
    low, high = _watermarks(consumer, tp, timeout_s)
    start, end = low, high
    if rng.start_offset is not None:
        start = max(low, rng.start_offset)
    if rng.end_offset is not None:
        end = min(high, rng.end_offset)
    if rng.start_ms is not None:
        found = consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, rng.start_ms)], timeout_s)
        start = max(start, found[0].offset if found[0].offset >= 0 else high)
    if rng.end_ms is not None:
        found = consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, rng.end_ms + 1)], timeout_s)
        end = min(end, found[0].offset if found[0].offset >= 0 else high)
    return start, end


def _read_partition(consumer: Consumer, tp: TopicPartition, start: int, end: int, result: ReplayResult,
                    timeout_s: float) -> list[Received]:
    out: list[Received] = []
    if start >= end:
        return out
    consumer.assign([TopicPartition(tp.topic, tp.partition, start)])
    position = start
    prompts = PromptResolver()
    while position < end:
        batch = fetch_ready(consumer, min(500, end - position), timeout_s)
        if not batch:
            raise ConsumeError(f"replay of {tp.topic}[{tp.partition}] stalled at offset {position} (end {end})")
        for msg in batch:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise ConsumeError(err.str())
                continue
            offset = msg.offset() or 0
            if offset >= end:
                position = end
                break
            position = offset + 1
            try:
                received = to_received(msg)
                if isinstance(received.event, LLMCall):
                    received = dataclasses.replace(received, event=prompts.resolve(received.event))
                out.append(received)
            except SchemaError as e:
                result.skipped.append((tp.topic, tp.partition, offset, str(e)))
    consumer.unassign()
    return out


def replay(config: BusConfig, topics: Iterable[str], rng: ReplayRange | None = None,
           timeout_s: float = 10.0) -> ReplayResult:
    """Reads `topics` (catalog names) over `rng` and returns the decoded events in produced order."""
    rng = rng or ReplayRange()
    consumer = Consumer(consumer_settings(config, unique_group("replay"), **{"enable.partition.eof": False}))
    result = ReplayResult()
    streams: list[list[Received]] = []
    try:
        for name in topics:
            full = config.topic(name)
            md = consumer.list_topics(full, timeout=timeout_s)
            meta = md.topics.get(full)
            if meta is None or meta.error is not None:
                raise ConsumeError(f"topic {full} not found")
            for partition in sorted(meta.partitions):
                tp = TopicPartition(full, partition)
                start, end = _bounds(consumer, tp, rng, timeout_s)
                streams.append(_read_partition(consumer, tp, start, end, result, timeout_s))
    except KafkaException as e:
        raise ConsumeError(f"replay failed: {e}") from e
    finally:
        consumer.close()
    result.events = list(heapq.merge(*streams, key=lambda r: (r.timestamp_ms, r.topic, r.partition, r.offset)))
    return result


