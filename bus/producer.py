"""Typed, idempotent producer: an event counts as recorded only once Kafka acknowledged it."""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bus.config import BusConfig
from bus.errors import PublishError
from bus.log import RDKAFKA_LOG
from bus.topics import topic_of
from schemas.errors import SchemaError
from schemas.events import Event, encode_event

log = logging.getLogger("sflow.bus")


@dataclass(frozen=True)
class Delivered:
    """Where Kafka stored an acknowledged event."""

    topic: str
    partition: int
    offset: int


#: The batching and compression every producer starts from (a service's `BusConfig.extra` or the
#: constructor's overrides win). lz4: cheapest codec per byte, and a 2,500-token call is 14 kB; linger 2 ms:
#: the proxy answers a call only once Kafka acknowledged it, so linger is latency added to every call, and
#: 5 ms bought no more than noise on bench/bus_bench.py (docs/architecture.md, "The hot path, as built").
PRODUCER_DEFAULTS: dict[str, Any] = {
    "compression.type": "lz4",
    "linger.ms": 2,
}

DeliveryCallback = Callable[[Delivered | None, PublishError | None], None]


class EventProducer:
    """Encodes events with their Avro schema and produces them with `acks=all` and idempotence.

    A background thread serves delivery reports, so `publish_sync` and `publish_async` return only
    when the broker acknowledged (or refused) the event; `flush` raises if anything stayed undelivered.
    """

    def __init__(
        self,
        config: BusConfig,
        producer_id: str | None = None,
        delivery_timeout_ms: int = 30_000,
        **overrides: Any,
    ) -> None:
        self.config = config
        self.producer_id = producer_id or config.client_id
        settings: dict[str, Any] = {
            "bootstrap.servers": config.bootstrap_servers,
            "client.id": self.producer_id,
            "enable.idempotence": True,
            "acks": "all",
            **PRODUCER_DEFAULTS,
            "message.max.bytes": 32 * 1024 * 1024,
            "delivery.timeout.ms": delivery_timeout_ms,
            "request.timeout.ms": min(delivery_timeout_ms, 30_000),
            "logger": RDKAFKA_LOG,
            **config.extra,
            **overrides,
        }
        try:
            self._producer = Producer(settings)
        except KafkaException as e:
            raise PublishError(f"cannot create producer: {e}") from e
        self._failures: list[PublishError] = []
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name=f"{self.producer_id}-delivery", daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def _stamp(self, event: Event) -> Event:
        """The event with this producer's id where it names none: a shallow copy with the one field set,
        not `dataclasses.replace` (which runs `__init__` and its conversions again, as costly as encoding)."""
        if event.producer:
            return event
        stamped = copy.copy(event)
        object.__setattr__(stamped, "producer", self.producer_id)
        return stamped

    def publish(
        self,
        event: Event,
        on_delivery: DeliveryCallback | None = None,
        topic: str | None = None,
        value: bytes | None = None,
    ) -> Event:
        """Queues an event; the callback (or `flush`) learns whether Kafka stored it. `value`: the event's
        encoding where the caller made it already (a store that keeps events before publishing them); it
        is used only for an event that names its producer (one this producer stamps is encoded again)."""
        stamped = self._stamp(event)
        if value is None or stamped is not event:
            try:
                value = encode_event(stamped)
            except SchemaError as e:
                raise PublishError(f"{stamped.event_type} cannot be encoded: {e}") from e
        event = stamped
        name = topic or self.config.topic(topic_of(type(event)).name)
        self.publish_raw(name, event.key.encode(), value, on_delivery)
        return event

    def publish_raw(
        self, topic: str, key: bytes | None, value: bytes | None, on_delivery: DeliveryCallback | None = None
    ) -> None:
        def report(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failure = PublishError(f"{topic}: {err.str()}")
                if on_delivery is None:
                    self._failures.append(failure)
                else:
                    on_delivery(None, failure)
            elif on_delivery is not None:
                on_delivery(Delivered(msg.topic() or topic, msg.partition() or 0, msg.offset() or 0), None)

        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=report)
                return
            except BufferError:
                self._producer.poll(0.1)  # local queue full: wait for deliveries, then retry
            except KafkaException as e:
                raise PublishError(f"{topic}: {e}") from e

    def publish_sync(self, event: Event, timeout_s: float = 60.0, topic: str | None = None) -> Delivered:
        """Publishes and blocks until Kafka acknowledged the event."""
        done = threading.Event()
        result: list[Delivered | PublishError] = []

        def on_delivery(d: Delivered | None, err: PublishError | None) -> None:
            result.append(err if err is not None else d)  # type: ignore[arg-type]
            done.set()

        self.publish(event, on_delivery, topic=topic)
        if not done.wait(timeout_s):
            raise PublishError(f"{event.event_type}: no acknowledgement within {timeout_s}s")
        outcome = result[0]
        if isinstance(outcome, PublishError):
            raise outcome
        return outcome

    async def publish_async(self, event: Event, topic: str | None = None, value: bytes | None = None) -> Delivered:
        """Publishes from asyncio code; resolves when Kafka acknowledged the event."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Delivered] = loop.create_future()

        def on_delivery(d: Delivered | None, err: PublishError | None) -> None:
            def settle() -> None:
                if future.done():
                    return
                if err is not None:
                    future.set_exception(err)
                else:
                    future.set_result(d)  # type: ignore[arg-type]

            loop.call_soon_threadsafe(settle)

        self.publish(event, on_delivery, topic=topic, value=value)
        return await future

    def flush(self, timeout_s: float = 60.0) -> None:
        """Waits for every queued event; raises if any was refused or is still undelivered."""
        remaining = self._producer.flush(timeout_s)
        failures, self._failures = self._failures, []
        if remaining:
            failures.append(PublishError(f"{remaining} events undelivered after {timeout_s}s"))
        if failures:
            raise PublishError("; ".join(str(f) for f in failures[:5]) + f" ({len(failures)} failures)")

    def close(self, timeout_s: float = 30.0) -> None:
        try:
            self.flush(timeout_s)
        finally:
            self._stop.set()
            self._poller.join(timeout=2)

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
