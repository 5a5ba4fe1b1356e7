"""Feeds the routing table from the bus: a background thread reading resources, scheduler and control.

It reads the topics from their beginning under a fresh consumer group, so a proxy that starts (or
restarts) rebuilds the routing state from the log (event sourcing) and then follows it. Offsets are
never committed: the next start reads everything again, which is what it needs.
"""

from __future__ import annotations

import logging
import threading
from typing import Final

from agents_adapter.proxy.routing import RoutingTable
from bus.config import BusConfig
from bus.consumer import EventConsumer, Received, unique_group
from bus.errors import BusError
from bus.metrics import ServiceMetrics

logger = logging.getLogger(__name__)
TOPICS: Final = ("resources", "scheduler", "control")
_RETRY_S: Final = 1.0


class RoutingFeed:
    def __init__(self, bus: BusConfig, table: RoutingTable, group_prefix: str = "agents-adapter-routing",
                 metrics: ServiceMetrics | None = None) -> None:
        self.bus = bus
        self.table = table
        self.group_id = unique_group(group_prefix)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="routing-feed", daemon=True)
        self.events_read = 0
        self._consumer: EventConsumer | None = None  # the current one (a reconnect makes a new one)
        if metrics is not None:
            metrics.watch_consumer(self.group_id, lambda: self._consumer.lag() if self._consumer else {},
                                   lambda: self._consumer.dead_lettered if self._consumer else 0)

    def start(self) -> RoutingFeed:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                consumer = EventConsumer(self.bus, self.group_id, TOPICS, track_lag=True)
            except Exception as e:  # confluent-kafka raises its own types at construction
                logger.warning("routing feed cannot connect: %s", e)
                self._stop.wait(_RETRY_S)
                continue
            self._consumer = consumer
            try:
                self._follow(consumer)
            finally:
                self._consumer = None
                try:
                    consumer.close()
                except BusError as e:
                    logger.debug("routing feed consumer close: %s", e)

    def _follow(self, consumer: EventConsumer) -> None:
        try:  # nothing committed (see the module doc); an event the table cannot apply ends the feed
            consumer.run(self._apply, self._stop, 0.25, on_error="raise", commit=False)
        except BusError as e:  # reconnect: the new consumer re-reads the log, rebuilding the same state
            logger.warning("routing feed poll failed: %s", e)
            self._stop.wait(_RETRY_S)

    def _apply(self, received: Received) -> None:
        self.events_read += 1
        self.table.apply(received.event)
