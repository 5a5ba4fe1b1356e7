"""The bus against a real broker: round trips, dead letters, evolution, Faust, replay, broker restart."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from bus.admin import ensure_topics
from bus.config import BusConfig
from bus.consumer import EventConsumer, Received
from bus.producer import EventProducer
from bus.replay import ReplayRange, replay
from bus.topics import CATALOG, topic_of
from infra.kafka.cluster import KafkaCluster, free_base_port
from schemas import events as ev
from schemas.registry import default_registry
from tests.factories import ALL_EVENT_TYPES, example

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


def consume_until(consumer: EventConsumer, count: int, timeout_s: float = 30.0) -> list[Received]:
    got: list[Received] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        for r in consumer.poll(0.5):
            got.append(r)
            consumer.mark_processed(r)
        consumer.commit()
    return got


def test_every_event_type_round_trips_through_kafka(bus_config: BusConfig) -> None:
    sent = [example(cls, i) for i, cls in enumerate(ALL_EVENT_TYPES)]
    with EventProducer(bus_config) as producer:
        stored = [producer.publish_sync(e) for e in sent]
    assert all(d.offset >= 0 for d in stored)
    consumer = EventConsumer(bus_config, "roundtrip", [t.name for t in CATALOG])
    try:
        got = consume_until(consumer, len(sent))
    finally:
        consumer.close()
    by_id = {r.event.event_id: r for r in got}
    for event in sent:
        received = by_id[event.event_id]
        assert received.event == _stamped(event)
        assert received.topic == bus_config.topic(topic_of(type(event)).name)
        assert received.key == event.key


def _stamped(event: ev.Event) -> ev.Event:
    import dataclasses

    return event if event.producer else dataclasses.replace(event, producer="pytest")


def test_corrupted_message_goes_to_dlq_and_consumer_keeps_going(bus_config: BusConfig) -> None:
    topic = bus_config.topic("sessions")
    good1 = example(ev.SessionStarted, 1, producer="p", session_id="same")
    good2 = example(ev.SessionEnded, 2, producer="p", session_id="same")
    with EventProducer(bus_config) as producer:
        producer.publish_sync(good1)
        producer.publish_raw(topic, b"k", b"\xc3\x01garbage-not-avro")
        producer.publish_raw(topic, b"k", b"plain text")
        producer.publish_sync(good2)
    consumer = EventConsumer(bus_config, "dlq-test", ["sessions"])
    try:
        got = consume_until(consumer, 2)
        assert [r.event for r in got] == [good1, good2]  # one key, so one partition: produced order
        assert consumer.dead_lettered == 2
    finally:
        consumer.close()
    dlq = EventConsumer(bus_config, "dlq-reader", ["dlq"])
    try:
        letters = [r.event for r in consume_until(dlq, 2)]
    finally:
        dlq.close()
    assert len(letters) == 2
    assert all(isinstance(letter, ev.DeadLetter) for letter in letters)
    reasons = sorted(letter.reason for letter in letters)  # type: ignore[attr-defined]
    assert any("unknown writer schema" in r or "header" in r for r in reasons)
    assert any("not c301" in r for r in reasons)
    assert {letter.value for letter in letters} == {b"\xc3\x01garbage-not-avro", b"plain text"}  # type: ignore[attr-defined]
    assert all(letter.source_topic == topic for letter in letters)  # type: ignore[attr-defined]


def test_poison_message_is_dead_lettered_by_run(bus_config: BusConfig) -> None:
    events = [example(ev.SessionStarted, i, session_id=f"s{i}") for i in range(5)]
    with EventProducer(bus_config) as producer:
        for e in events:
            producer.publish_sync(e)
    handled: list[str] = []
    stop = threading.Event()

    def handle(r: Received) -> None:
        session = r.event.session_id  # type: ignore[attr-defined]
        if session == "s2":
            raise ValueError("cannot process s2")
        handled.append(session)
        if len(handled) == 4:
            stop.set()

    consumer = EventConsumer(bus_config, "poison", ["sessions"])
    timer = threading.Timer(30, stop.set)
    timer.start()
    try:
        consumer.run(handle, stop)
    finally:
        timer.cancel()
        consumer.close()
    assert sorted(handled) == ["s0", "s1", "s3", "s4"]
    result = replay(bus_config, ["dlq"])
    assert [r.event.reason for r in result.events] == ["handler failed: ValueError: cannot process s2"]  # type: ignore[attr-defined]


def test_old_writer_is_read_by_new_reader_with_defaults(bus_config: BusConfig) -> None:
    registry = default_registry()
    v1 = registry.versions("LLMCall")[0]
    call = example(ev.LLMCall, drift=True, parent_call_id="parent")
    v1_names = {f["name"] for f in v1.definition["fields"]}
    old_bytes = registry.encode("LLMCall", {k: v for k, v in call.to_avro().items() if k in v1_names}, version=v1)
    with EventProducer(bus_config) as producer:
        producer.publish_raw(bus_config.topic("llm.calls"), call.session_id.encode(), old_bytes)
    [received] = replay(bus_config, ["llm.calls"]).events
    assert isinstance(received.event, ev.LLMCall)
    assert received.event.drift is False and received.event.parent_call_id == ""
    assert received.event.output_ids == call.output_ids


def test_faust_agent_receives_typed_events(bus_config: BusConfig, tmp_path: Path) -> None:
    out = tmp_path / "seen.jsonl"
    events = [example(ev.SessionStarted, i, session_id=f"s{i}") for i in range(3)]
    events.append(example(ev.SessionEnded, 9, session_id="s0"))
    with EventProducer(bus_config) as producer:
        for e in events:
            producer.publish_sync(e)
        producer.publish_raw(bus_config.topic("sessions"), b"x", b"not an event")
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("faust_typed_worker.py")),
            bus_config.bootstrap_servers,
            bus_config.topic_prefix,
            str(tmp_path / "faust"),
            str(out),
            str(len(events)),
        ],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((s["type"], s["session"]) for s in seen) == sorted((e.event_type, e.session_id) for e in events)
    letters = replay(bus_config, ["dlq"]).events
    assert [r.event.value for r in letters] == [b"not an event"]  # type: ignore[attr-defined]


def test_replay_of_a_range_gives_the_produced_events_in_order_per_key(bus_config: BusConfig) -> None:
    sessions = [f"s{i}" for i in range(6)]
    produced: list[ev.Event] = []
    with EventProducer(bus_config) as producer:
        for turn in range(5):
            for s in sessions:
                produced.append(producer.publish(example(ev.LLMCall, turn, session_id=s, turn=turn)))
        producer.flush()
    full = replay(bus_config, ["llm.calls"])
    assert not full.skipped
    per_key: dict[str, list[int]] = defaultdict(list)
    for r in full.events:
        per_key[r.event.session_id].append(r.event.turn)  # type: ignore[attr-defined]
    assert per_key == {s: [0, 1, 2, 3, 4] for s in sessions}
    assert {r.event.event_id for r in full.events} == {e.event_id for e in produced}
    # An offset range: the first two offsets of each partition.
    part = replay(bus_config, ["llm.calls"], ReplayRange(start_offset=0, end_offset=2))
    for r in part.events:
        assert r.offset < 2
    assert len(part.events) == sum(min(2, sum(1 for x in full.events if x.partition == p)) for p in range(4))
    # A time range that covers everything returns everything.
    t0 = min(r.timestamp_ms for r in full.events)
    t1 = max(r.timestamp_ms for r in full.events)
    assert len(replay(bus_config, ["llm.calls"], ReplayRange(start_ms=t0, end_ms=t1)).events) == len(full.events)
    assert replay(bus_config, ["llm.calls"], ReplayRange(start_ms=t1 + 1000)).events == []


@pytest.mark.slow
def test_broker_killed_and_restarted_loses_no_acknowledged_event(tmp_path: Path) -> None:
    """SIGKILL the broker while an idempotent producer streams events; every acknowledged event
    is in the log exactly once after the restart."""
    cluster = KafkaCluster(tmp_path / "kafka", nodes=1, base_port=free_base_port())
    cluster.start()
    try:
        config = BusConfig(bootstrap_servers=cluster.bootstrap_servers, topic_prefix="restart.")
        ensure_topics(config)
        acked: list[str] = []
        failed: list[str] = []
        producer = EventProducer(config, delivery_timeout_ms=120_000)

        def on_delivery(d: object, err: object) -> None:
            (failed if err is not None else acked).append("x")

        sent: list[str] = []
        for i in range(3000):
            e = producer.publish(example(ev.Heartbeat, i, resource_id=f"r{i % 3}"), on_delivery)
            sent.append(e.event_id)
            if i == 1000:
                producer._producer.flush(30)
                cluster.stop(kill=True)
            if i == 1500:
                cluster.start()
        producer.flush(120)
        producer.close()
        assert not failed
        assert len(acked) == len(sent)
        ids = [r.event.event_id for r in replay(config, ["resources"]).events]
        assert sorted(ids) == sorted(sent)  # every acknowledged event, none twice
    finally:
        cluster.stop()
