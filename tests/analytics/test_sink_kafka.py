"""The analytics sink against the real broker: produced events become rows while it runs, and a sink
killed with SIGKILL (anywhere, or in the window between rows and ledger) and restarted stores every
event exactly once as queries see it."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from bus.config import BusConfig
from bus.process import ManagedProcess
from bus.producer import EventProducer
from infra.analytics.config import AnalyticsConfig, open_store
from infra.analytics.rows import rows_of
from infra.analytics.sink import AnalyticsSink
from infra.analytics.store import AnalyticsStore
from infra.analytics.tables import EVENT_TABLES
from schemas import events as ev
from tests.factories import ALL_EVENT_TYPES, example

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


def mixed_events(n: int, start: int = 0) -> list[ev.Event]:
    """n events cycling through every event type (an LLMCall has two segments)."""
    return [example(ALL_EVENT_TYPES[i % len(ALL_EVENT_TYPES)], i) for i in range(start, start + n)]


def expected_counts(events: Sequence[ev.Event], extra_dead_letters: int = 0) -> dict[str, int]:
    counts = Counter({t.name: 0 for t in EVENT_TABLES})
    for e in events:
        counts.update(name for name, _ in rows_of(e, "t", 0, 0))
    counts["dlq"] += extra_dead_letters
    return dict(counts)


def stored_event_ids(store: AnalyticsStore) -> list[str]:
    union = " UNION ALL ".join(
        f"SELECT event_id FROM {{db}}.{t.name} FINAL" for t in EVENT_TABLES if t.name != "llm_call_segments"
    )
    return [row[0] for row in store.query(union).rows]


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def produce(config: BusConfig, events: Sequence[ev.Event]) -> None:
    with EventProducer(config) as producer:
        for e in events:
            producer.publish(e)
        producer.flush()


def test_produced_events_become_rows_while_the_sink_runs(bus_config: BusConfig, tmp_path: Path) -> None:
    config = AnalyticsConfig(data_dir=tmp_path, group_id=f"analytics-{uuid.uuid4().hex[:6]}",
                             flush_interval_s=0.2, poll_timeout_s=0.2)
    events = mixed_events(2 * len(ALL_EVENT_TYPES))
    store = open_store(config)
    sink = AnalyticsSink(config, store, bus=bus_config)
    stop = threading.Event()
    runner = threading.Thread(target=sink.run, args=(stop,), name="analytics-sink")
    runner.start()
    try:
        with EventProducer(bus_config) as producer:
            first = producer.publish_sync(events[0])
            for e in events[1:]:
                producer.publish(e)
            # a message that is not an event: the consumer dead-letters it, and the sink stores the letter
            producer.publish_raw(bus_config.topic("sessions"), b"k", b"not avro")
            producer.flush()
        expected = expected_counts(events, extra_dead_letters=1)
        wait_until(lambda: store.counts() == expected, 30, f"rows {expected}")
    finally:
        stop.set()
        runner.join(30)
    try:
        assert not runner.is_alive()
        row = store.query("SELECT topic, partition, offset FROM {db}.llm_calls FINAL WHERE event_id = {id:String}",
                          {"id": events[0].event_id}).rows
        assert row == [(first.topic, first.partition, first.offset)]
        letter = store.query("SELECT source_topic, reason FROM {db}.dlq FINAL WHERE value_size = 8").rows
        assert letter[0][0] == bus_config.topic("sessions") and "undecodable" in letter[0][1]
        assert store.count("llm_calls", final=False) == store.count("llm_calls")
        assert sink.stats.events == len(events) + 1 and sink.stats.dead_lettered == 0
    finally:
        store.close()


def sink_command(config: BusConfig, data_dir: Path, group: str, *extra: str) -> list[str]:
    return [
        "--bootstrap-servers", config.bootstrap_servers, "--topic-prefix", config.topic_prefix,
        "--data-dir", str(data_dir), "--group-id", group, "--batch-max-events", "50",
        "--flush-interval-s", "0.05", "--poll-timeout-s", "0.1", "--log-level", "debug", *extra,
    ]


def start_sink(args: list[str], log: Path, module: str = "infra.analytics",
               before: Sequence[str] = ()) -> ManagedProcess:
    return ManagedProcess(module, [*before, *args], log=log, cwd=REPO, name=module).start()


def flushes(log: Path) -> int:
    return log.read_text(errors="replace").count("msg='flushed'") if log.exists() else 0


def test_sigkill_mid_stream_then_restart_stores_every_event_once(bus_config: BusConfig, tmp_path: Path) -> None:
    early, late = mixed_events(300), mixed_events(600, start=300)
    produce(bus_config, early)
    group, log = f"analytics-{uuid.uuid4().hex[:6]}", tmp_path / "sink.log"
    args = sink_command(bus_config, tmp_path, group)
    first = start_sink(args, log)
    streaming = threading.Event()

    def produce_while_running() -> None:
        with EventProducer(bus_config) as producer:
            streaming.set()
            for i in range(0, len(late), 20):
                for e in late[i:i + 20]:
                    producer.publish(e)
                producer.flush()
                time.sleep(0.03)

    try:
        wait_until(lambda: flushes(log) >= 1, 60, "the sink's first flush")
        producer = threading.Thread(target=produce_while_running)
        producer.start()
        streaming.wait(10)
        seen = flushes(log)
        wait_until(lambda: flushes(log) >= seen + 2, 30, "two more flushes")
        first.kill()
    finally:
        first.kill()  # a no-op once it exited
    assert first.returncode == -signal.SIGKILL
    with open_store(AnalyticsConfig(data_dir=tmp_path), read_only=True) as store:
        at_kill = sum(store.counts().values())
    total_rows = sum(expected_counts([*early, *late]).values())
    assert 0 < at_kill < total_rows  # killed mid-stream

    second = start_sink([*args, "--idle-exit-s", "3"], log)  # while the producer may still be going
    try:
        producer.join(60)
        assert second.wait_exit(90) == 0
    finally:
        second.kill()
    events = [*early, *late]
    with open_store(AnalyticsConfig(data_dir=tmp_path), read_only=True) as store:
        assert store.counts() == expected_counts(events)
        ids = stored_event_ids(store)
    assert len(ids) == len(events) and set(ids) == {e.event_id for e in events}


def test_kill_between_rows_and_ledger_leaves_no_duplicate_in_queries(bus_config: BusConfig, tmp_path: Path) -> None:
    events = mixed_events(500)
    produce(bus_config, events)
    group, log = f"analytics-{uuid.uuid4().hex[:6]}", tmp_path / "sink.log"
    args = sink_command(bus_config, tmp_path, group)
    crashing = start_sink(args, log, module="tests.analytics.crashing_sink", before=["3"])
    try:
        assert crashing.wait_exit(90) == -signal.SIGKILL
    finally:
        crashing.kill()
    with open_store(AnalyticsConfig(data_dir=tmp_path), read_only=True) as store:
        ledger_end = sum(store.stored_offsets().values())
        stored = len(stored_event_ids(store))
    assert stored > ledger_end > 0  # the third flush's rows are in, its ledger (and Kafka commit) are not

    restarted = start_sink([*args, "--idle-exit-s", "2"], log)
    try:
        assert restarted.wait_exit(90) == 0
    finally:
        restarted.kill()
    with open_store(AnalyticsConfig(data_dir=tmp_path), read_only=True) as store:
        assert store.counts() == expected_counts(events)
        ids = stored_event_ids(store)
        assert sum(store.stored_offsets().values()) == len(events)
    assert len(ids) == len(events) and set(ids) == {e.event_id for e in events}
