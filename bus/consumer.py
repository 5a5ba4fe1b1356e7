"""Typed consumer: at-least-once with manual commits, undecodable or poison messages to the DLQ.

A message is committed only after the handler processed it (or after the dead-letter topic
acknowledged it), so a consumer killed at any point re-reads at most the messages it had not
finished; it never skips one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from bus.config import BusConfig
from bus.deadletter import dead_letter
from bus.errors import ConsumeError
from bus.log import RDKAFKA_LOG
from bus.producer import EventProducer
from schemas.errors import SchemaError
from schemas.events import Event, decode_event

if TYPE_CHECKING:
    from bus.metrics import ServiceMetrics

log = logging.getLogger("sflow.bus")
_LAG_EVERY_S = 1.0  # how often a consumer with metrics reads its lag (after a poll)

#: Overrides for a reader of every event of busy topics that needs no sub-second latency (the analytics sink,
#: a run's monitor): the broker answers a fetch once 1 MiB is there or 200 ms passed. With librdkafka's
#: `fetch.min.bytes` of 1 such a reader makes a fetch round trip for nearly every event produced, which the
#: broker and the reader pay for in CPU (docs/architecture.md, "The hot path, as built").
BATCHED_FETCH: Final[Mapping[str, Any]] = MappingProxyType({"fetch.wait.max.ms": 200, "fetch.min.bytes": 1 << 20})


@dataclass(frozen=True)
class Received:
    """A decoded event with where it was read from."""

    event: Event
    topic: str
    partition: int
    offset: int
    key: str | None
    timestamp_ms: int
    raw: bytes = field(default=b"", repr=False, compare=False)


def consumer_settings(config: BusConfig, group_id: str, **overrides: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": config.client_id,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 32 * 1024 * 1024,
        "isolation.level": "read_committed",
        "logger": RDKAFKA_LOG,
        **config.extra,
        **overrides,
    }


def group_start_offsets(config: BusConfig, group_id: str, partitions: Iterable[tuple[str, int]],
                        timeout_s: float = 10.0) -> dict[tuple[str, int], int]:
    """Where a consumer group resumes each (full topic name, partition): its committed offset, or the
    partition's earliest offset where it has none. Read without joining the group.

    A Faust worker needs it: faust-streaming 0.15.3 on aiokafka 0.14 seeks only partitions with a
    committed offset > 0, and a partition with messages but no commit was read from about its end,
    skipping what was produced before the worker started (the trajectory processor's SIGKILL tests).
    """
    consumer = Consumer(consumer_settings(config, group_id))
    try:
        tps = [TopicPartition(topic, p) for topic, p in partitions]
        out: dict[tuple[str, int], int] = {}
        for tp in consumer.committed(tps, timeout=timeout_s) if tps else []:
            start = tp.offset if tp.offset >= 0 else consumer.get_watermark_offsets(tp, timeout=timeout_s)[0]
            out[(tp.topic, tp.partition)] = start
        return out
    except KafkaException as e:
        raise ConsumeError(f"cannot read the start offsets of group {group_id}: {e}") from e
    finally:
        consumer.close()


def fetch_ready(consumer: Consumer, max_messages: int, timeout_s: float) -> list[Message]:
    """Waits up to `timeout_s` for one message, then takes whatever else is ready without waiting
    (librdkafka's `consume(n, timeout)` alone would wait the whole timeout for n messages)."""
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, 0)] if max_messages > 1 else [first]


def to_received(msg: Message) -> Received:
    """Decodes a Kafka message; raises SchemaError when it is not a valid event."""
    value = msg.value()
    if value is None:
        raise SchemaError("message has no value (tombstone)")
    key = msg.key()
    return Received(
        event=decode_event(value),
        topic=msg.topic() or "",
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        key=key.decode("utf-8", "replace") if key is not None else None,
        timestamp_ms=msg.timestamp()[1],
        raw=value,
    )


class EventConsumer:
    """Reads catalog topics as typed events for one consumer group."""

    def __init__(
        self,
        config: BusConfig,
        group_id: str,
        topics: Iterable[str],
        *,
        dlq: EventProducer | None = None,
        subscribe: bool = True,
        metrics: ServiceMetrics | None = None,
        track_lag: bool = False,
        **overrides: Any,
    ) -> None:
        self.config = config
        self.group_id = group_id
        self.topics = [config.topic(t) for t in topics]
        self._dlq = dlq
        self._owns_dlq = dlq is None
        self._consumer = Consumer(consumer_settings(config, group_id, **overrides))
        self._subscribed = subscribe
        if subscribe:
            self._consumer.subscribe(self.topics)
        self._pending: dict[tuple[str, int], int] = {}
        self.dead_lettered = 0
        self._lag: dict[str, int] = {}
        # read only for metrics (`track_lag`: for an owner that exports it itself, as one consumer of several)
        self._lag_read_at = 0.0 if metrics is not None or track_lag else math.inf
        if metrics is not None:  # lag and dead letters read at scrape time (bus.metrics)
            metrics.watch_consumer(group_id, self.lag, lambda: self.dead_lettered)

    def _dead_letter(
        self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, reason: str
    ) -> None:
        if self._dlq is None:
            self._dlq = EventProducer(self.config, producer_id=f"{self.config.client_id}-dlq")
        letter = dead_letter(topic, partition, offset, key=key, value=value, reason=reason,
                             consumer_group=self.group_id)
        self._dlq.publish_sync(letter, topic=self.config.topic("dlq"))
        self.dead_lettered += 1
        log.warning("dead-lettered %s[%s]@%s: %s", topic, partition, offset, reason)

    def poll(self, timeout_s: float = 1.0, max_messages: int = 500) -> list[Received]:
        """Decoded events in partition order; undecodable ones are dead-lettered and marked done."""
        try:
            messages = fetch_ready(self._consumer, max_messages, timeout_s)
            if time.monotonic() - self._lag_read_at >= _LAG_EVERY_S:
                self._lag, self._lag_read_at = self._read_lag(), time.monotonic()
        except KafkaException as e:
            raise ConsumeError(str(e)) from e
        out: list[Received] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                # librdkafka reports a fatal error as an event of code _FATAL whose own `fatal()` is False
                # (seen: a static member fenced after a broker died, the scheduler then read nothing again)
                if err.fatal() or err.code() == KafkaError._FATAL:
                    raise ConsumeError(err.str())
                log.warning("consumer error: %s", err.str())
                continue
            try:
                out.append(to_received(msg))
            except SchemaError as e:
                topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
                self._dead_letter(topic, partition, offset, msg.key(), msg.value(), f"undecodable: {e}")
                self._mark(topic, partition, offset)
        return out

    def _mark(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        self._pending[key] = max(self._pending.get(key, 0), offset + 1)

    def mark_processed(self, received: Received) -> None:
        """Records that the handler finished with `received`; `commit` then makes it durable."""
        self._mark(received.topic, received.partition, received.offset)

    def dead_letter(self, received: Received, reason: str) -> None:
        """Sends a decodable message the handler cannot process (a poison message) to the DLQ."""
        r = received
        key = r.key.encode() if r.key is not None else None
        self._dead_letter(r.topic, r.partition, r.offset, key, r.raw, reason)
        self.mark_processed(received)

    def commit(self) -> None:
        """Synchronously commits every processed offset."""
        if not self._pending:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._pending.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            raise ConsumeError(f"commit failed: {e}") from e
        self._pending.clear()

    def run(
        self,
        handle: Callable[[Received], None],
        stop: threading.Event,
        poll_timeout_s: float | Callable[[], float] = 0.5,
        on_idle: Callable[[], None] | None = None,
        *,
        on_batch: Callable[[list[Received]], None] | None = None,
        max_messages: int | Callable[[], int] = 500,
        on_error: Literal["dead_letter", "raise"] = "dead_letter",
        commit: bool = True,
    ) -> None:
        """The consumer loop of every service: handles events until `stop` is set, committing after each
        batch. A handler exception dead-letters that message (a poison message must not stop the
        consumer); `on_batch` runs after a batch's handlers and before its commit (where a service makes
        its own state durable: the commit then never runs ahead of it), `on_idle` after an empty poll.
        `poll_timeout_s` and `max_messages` may be functions, read before each poll (a service that must
        wake for a tick, or that has room for only so many rows).

        `on_error="raise"`: a handler exception leaves the loop at once, the batch uncommitted (for a
        service whose failure may leave decisions unpublished: its restart must read those inputs again;
        the caller must not `close()` with a commit then). `commit=False`: the loop marks and commits
        nothing (a service that keeps its own offsets, or commits only once its store has the rows)."""
        while not stop.is_set():
            timeout = poll_timeout_s() if callable(poll_timeout_s) else poll_timeout_s
            batch = self.poll(timeout, max_messages() if callable(max_messages) else max_messages)
            for received in batch:
                try:
                    handle(received)
                except Exception as e:
                    if on_error == "raise":
                        raise
                    log.exception("handler failed on %s@%d", received.topic, received.offset)
                    self.dead_letter(received, f"handler failed: {type(e).__name__}: {e}")
                    continue
                if commit:
                    self.mark_processed(received)
            if on_batch is not None:
                on_batch(batch)
            if commit:
                self.commit()
            if not batch and on_idle is not None:
                on_idle()

    def lag(self) -> dict[str, int]:
        """Messages not read yet on the assigned partitions, per topic (without the prefix), as of the last
        poll (at most `_LAG_EVERY_S` old). Read in the polling thread, never from the scrape's: the
        client is not called from two threads at once."""
        return dict(self._lag)

    def _read_lag(self) -> dict[str, int]:
        """From the client's cached high watermarks (the last fetch's): it asks the broker nothing."""
        out: dict[str, int] = {}
        for tp in self._consumer.position(self._consumer.assignment()):
            _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            known = tp.offset >= 0 and high >= 0  # neither is known before the partition's first fetch
            topic = tp.topic.removeprefix(self.config.topic_prefix)
            out[topic] = out.get(topic, 0) + (max(0, high - tp.offset) if known else 0)
        return out

    def assigned(self) -> bool:
        """Whether the group gave this consumer its partitions yet."""
        return bool(self._consumer.assignment())

    def partitions(self, topic: str, timeout_s: float = 30.0) -> list[int]:
        """Partition numbers of a full topic name."""
        try:
            meta = self._consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException as e:
            raise ConsumeError(f"cannot read metadata of {topic}: {e}") from e
        if meta is None or meta.error is not None:
            raise ConsumeError(f"topic {topic} is not available: {meta.error if meta else 'missing'}")
        return sorted(meta.partitions)

    def assign(self, starts: dict[tuple[str, int], int | None]) -> None:
        """Reads exactly these partitions from these offsets (None: the beginning), outside any
        group rebalance: for services that keep their own offsets (e.g. in a checkpoint)."""
        if self._subscribed:
            # A group join still in flight would revoke (unassign) a manual assignment made now.
            raise ConsumeError("assign() needs a consumer built with subscribe=False")
        tps = [TopicPartition(t, p, OFFSET_BEGINNING if o is None else o) for (t, p), o in starts.items()]
        try:
            self._consumer.assign(tps)
        except KafkaException as e:
            raise ConsumeError(f"cannot assign {len(tps)} partitions: {e}") from e

    def seek_to_beginning(self) -> None:
        for tp in self._consumer.assignment():
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING))

    def close(self, commit: bool = True) -> None:
        """Closes the consumer; `commit=False` leaves unconfirmed work to be re-read by the next one."""
        try:
            if commit:
                self.commit()
        finally:
            self._consumer.close()
            if self._owns_dlq and self._dlq is not None:
                self._dlq.close()


def unique_group(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
