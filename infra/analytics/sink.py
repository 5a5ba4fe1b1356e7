"""The analytics sink: every catalog topic into ClickHouse tables, exactly once in what queries see.

Order of a flush (the whole exactly-once argument):

1. insert the buffered rows, table by table (each insert returns once its part is on disk);
2. advance the ledger (`sink_offsets`: next offset per topic partition) in the store;
3. commit the same offsets to Kafka.

A sink killed anywhere restarts from the Kafka-committed offsets, so it never skips an event (no loss).
Events it re-reads below the ledger were stored by the run that died between steps 2 and 3: they are
skipped (no physical duplicate). Events re-read above the ledger (a death between steps 1 and 2) are
inserted again; their copies share the sorting key (ts, event_id[, item]) of a ReplacingMergeTree, so
`SELECT ... FINAL` and merges keep one (no duplicate in any query result). Before trusting the ledger for
a partition, the sink checks that the first event it would skip is really stored (one primary-key
lookup), so a ledger left from a deleted and recreated topic is ignored rather than silently skipping.

`AnalyticsWriter` is that logic without Kafka (tests drive it with hand-made `Received`s);
`AnalyticsSink` is the shell around an `EventConsumer`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bus.config import BusConfig
from bus.consumer import BATCHED_FETCH, EventConsumer, Received
from bus.errors import ConsumeError
from bus.retry import Backoff, retry
from infra.analytics.config import AnalyticsConfig
from infra.analytics.errors import AnalyticsError, RowError
from infra.analytics.rows import rows_of
from infra.analytics.store import AnalyticsStore, TopicPartition
from infra.analytics.tables import Row
from schemas.events import now_ms

log = logging.getLogger("sflow.analytics")

_FLUSH_RETRIES = Backoff(attempts=3, first_s=1.0, growth="linear")  # pauses of 1 s, then 2 s


@dataclass
class SinkStats:
    """Totals of one sink run."""

    events: int = 0  # events read (stored, skipped or dead-lettered)
    rows: int = 0  # rows inserted
    skipped: int = 0  # events below the ledger: stored by an earlier run
    dead_lettered: int = 0  # events that could not be turned into rows
    flushes: int = 0
    rows_by_table: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class AnalyticsWriter:
    """Buffers the rows of received events and writes them rows-first, ledger-second."""

    def __init__(self, store: AnalyticsStore, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.stats = SinkStats()
        self._clock = clock
        self._ledger: dict[TopicPartition, int] = store.stored_offsets()
        self._verified: set[TopicPartition] = set()
        self._rows: dict[str, list[Row]] = defaultdict(list)
        self._next: dict[TopicPartition, int] = {}
        self._handled: list[Received] = []
        self._first_at: float | None = None

    @property
    def pending(self) -> int:
        """Events handled since the last flush (their offsets are not yet committed)."""
        return len(self._handled)

    def age_s(self) -> float:
        return 0.0 if self._first_at is None else self._clock() - self._first_at

    def ledger(self) -> dict[TopicPartition, int]:
        return dict(self._ledger)

    def _account(self, r: Received) -> None:
        tp = (r.topic, r.partition)
        self._next[tp] = max(self._next.get(tp, 0), r.offset + 1)
        self._handled.append(r)
        self.stats.events += 1
        if self._first_at is None:
            self._first_at = self._clock()

    def add(self, r: Received) -> bool:
        """Buffers the rows of one event; False if an earlier run already stored it. Raises `RowError` for
        an event that cannot become rows (its offset still counts as handled)."""
        try:
            rows = rows_of(r.event, r.topic, r.partition, r.offset)
        except Exception as e:
            self._account(r)
            self.stats.dead_lettered += 1
            raise RowError(f"{r.event.event_type} {r.event.event_id}: {type(e).__name__}: {e}") from e
        self._account(r)
        if self._already_stored(r, rows[0][0]):
            self.stats.skipped += 1
            return False
        for table_name, row in rows:
            self._rows[table_name].append(row)
        return True

    def _already_stored(self, r: Received, main_table: str) -> bool:
        tp = (r.topic, r.partition)
        if r.offset >= self._ledger.get(tp, 0):
            return False
        if tp in self._verified:
            return True
        if self.store.contains(main_table, r.event.ts_ms, r.event.event_id):
            self._verified.add(tp)
            return True
        log.warning(
            "ledger says %s[%d] is stored below offset %d, but event %s at offset %d is not: the topic was "
            "recreated? ignoring the ledger for this partition", r.topic, r.partition, self._ledger[tp],
            r.event.event_id, r.offset, extra={"topic": r.topic, "partition": r.partition},
        )
        self._ledger[tp] = 0
        return False

    def flush(self) -> list[Received]:
        """Inserts the buffered rows, then advances the ledger; returns the events handled since the last
        flush, in the order they were read (the shell commits their offsets)."""
        if not self._handled:
            return []
        for table_name, rows in self._rows.items():
            self.store.insert(table_name, rows)
            self.stats.rows += len(rows)
            self.stats.rows_by_table[table_name] += len(rows)
        self.store.record_offsets(self._next, now_ms())
        self._ledger.update(self._next)
        handled = self._handled
        self._rows = defaultdict(list)
        self._next = {}
        self._handled = []
        self._first_at = None
        self.stats.flushes += 1
        return handled


class AnalyticsSink:
    """Consumes the configured topics and keeps the store in step with them."""

    def __init__(self, config: AnalyticsConfig, store: AnalyticsStore, bus: BusConfig | None = None) -> None:
        self.config = config
        self.bus = bus or config.bus_config()
        self.writer = AnalyticsWriter(store)
        overrides: dict[str, Any] = {**BATCHED_FETCH, "session.timeout.ms": config.session_timeout_ms}
        if config.group_instance_id:
            overrides["group.instance.id"] = config.group_instance_id
        self.consumer = EventConsumer(self.bus, config.group_id, config.topics, **overrides)

    @property
    def stats(self) -> SinkStats:
        return self.writer.stats

    def run(self, stop: threading.Event | None = None) -> SinkStats:
        """Runs until `stop` is set (or `idle_exit_s` passes without events), then flushes and closes."""
        stop = stop or threading.Event()
        cfg = self.config
        log.info("analytics sink started", extra={
            "group": cfg.group_id, "topics": ",".join(cfg.topics), "prefix": self.bus.topic_prefix,
            "ledger_partitions": len(self.writer.ledger()),
        })
        try:
            # The loop commits nothing itself: offsets are marked and committed by `_flush`, after the rows
            # and the ledger (and an error other than a row's leaves the loop, not the message dead-lettered).
            self.consumer.run(self._handle, stop, self._poll_timeout_s, on_batch=self._after_batch(stop),
                              max_messages=self._room, on_error="raise", commit=False)
            self._flush()
        except BaseException:
            # Not closing the consumer on purpose: close() commits every marked offset, and the bus marks
            # dead-lettered messages at once, possibly past rows this failed run never stored.
            log.exception("analytics sink failed: offsets not committed past the stored rows")
            raise
        self.consumer.close()
        s = self.stats
        log.info("analytics sink stopped", extra={
            "events": s.events, "rows": s.rows, "skipped": s.skipped, "dead_lettered": s.dead_lettered,
            "flushes": s.flushes,
        })
        return s

    def _poll_timeout_s(self) -> float:
        """No longer than until the buffered rows are due."""
        timeout = self.config.poll_timeout_s
        if self.writer.pending:
            timeout = max(0.0, min(timeout, self.config.flush_interval_s - self.writer.age_s()))
        return timeout

    def _room(self) -> int:
        """Events the buffer still takes (at most one poll's worth)."""
        return max(1, min(500, self.config.batch_max_events - self.writer.pending))

    def _after_batch(self, stop: threading.Event) -> Callable[[list[Received]], None]:
        """After each poll: a flush when the buffer is full or due; with nothing buffered and no event for
        `idle_exit_s`, `stop` (the sink's own end)."""
        cfg = self.config
        last_event = time.monotonic()

        def after(batch: list[Received]) -> None:
            nonlocal last_event
            now = time.monotonic()
            if batch:
                last_event = now
            if self.writer.pending and (
                self.writer.pending >= cfg.batch_max_events or self.writer.age_s() >= cfg.flush_interval_s
            ):
                self._flush()
            elif not self.writer.pending and cfg.idle_exit_s and now - last_event >= cfg.idle_exit_s:
                log.info("idle: exiting", extra={"idle_s": round(now - last_event, 1)})
                stop.set()

        return after

    def _handle(self, received: Received) -> None:
        try:
            self.writer.add(received)
        except RowError as e:
            log.warning("dead-lettering: %s", e, extra={"topic": received.topic, "offset": received.offset})
            self.consumer.dead_letter(received, f"analytics: {e}")

    def _flush(self) -> None:
        """Rows, then ledger (the writer), then the Kafka commit; a failing store is retried, then raises
        (a restarted sink resumes exactly where the durable rows end)."""
        def failed(attempt: int, e: Exception) -> None:
            if attempt < _FLUSH_RETRIES.attempts:
                log.warning("flush failed, retrying: %s", e, extra={"attempt": attempt})

        handled = retry(self.writer.flush, _FLUSH_RETRIES, retry_on=(AnalyticsError,), on_failure=failed)
        if not handled:
            return
        for received in handled:
            self.consumer.mark_processed(received)
        try:
            self.consumer.commit()
        except ConsumeError as e:  # the rows and the ledger are durable: a re-read of these events is skipped
            log.warning("offset commit failed, retried with the next flush: %s", e)
        log.debug("flushed", extra={"events": len(handled), "rows_total": self.stats.rows})
