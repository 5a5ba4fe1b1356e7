"""`EventConsumer.run`'s options for services that must not commit what they did not finish: a handler
error that stops the loop (`on_error="raise"`) and a loop that commits nothing (`commit=False`)."""

from __future__ import annotations

import threading

import pytest

from bus.config import BusConfig
from bus.consumer import EventConsumer, Received, group_start_offsets, unique_group
from bus.producer import EventProducer
from bus.replay import replay
from schemas import events as ev
from tests.factories import example

pytestmark = pytest.mark.kafka


def produce_sessions(config: BusConfig, n: int) -> None:
    with EventProducer(config) as producer:
        for i in range(n):
            producer.publish_sync(example(ev.SessionStarted, i, session_id=f"s{i}"))


def resumes_at(config: BusConfig, group: str) -> dict[tuple[str, int], int]:
    """Where `group` resumes each partition of `sessions` (0, the first offset, where it committed nothing)."""
    topic = config.topic("sessions")
    probe = EventConsumer(config, unique_group("probe"), ["sessions"], subscribe=False)
    try:
        partitions = [(topic, p) for p in probe.partitions(topic)]
    finally:
        probe.close(commit=False)
    return group_start_offsets(config, group, partitions)


def test_a_handler_error_leaves_run_with_nothing_committed_or_dead_lettered(bus_config: BusConfig) -> None:
    produce_sessions(bus_config, 5)
    stop = threading.Event()
    timer = threading.Timer(30, stop.set)
    handled: list[str] = []
    failed: list[Received] = []

    def handle(r: Received) -> None:
        session = r.event.session_id  # type: ignore[attr-defined]
        if len(handled) == 3:
            failed.append(r)
            raise ValueError(f"cannot process {session}")
        handled.append(session)

    group = unique_group("raise")
    consumer = EventConsumer(bus_config, group, ["sessions"])
    timer.start()
    try:
        with pytest.raises(ValueError, match="cannot process"):
            consumer.run(handle, stop, on_error="raise")
    finally:
        timer.cancel()
        consumer.close(commit=False)
    assert len(handled) == 3 and len(failed) == 1 and not stop.is_set()
    # Batches finished before it were committed; the failed message is read again (its batch was not).
    f = failed[0]
    assert resumes_at(bus_config, group)[(f.topic, f.partition)] <= f.offset
    assert replay(bus_config, ["dlq"]).events == []


def test_a_loop_without_commits_leaves_the_offsets_to_the_service(bus_config: BusConfig) -> None:
    produce_sessions(bus_config, 4)
    stop = threading.Event()
    timer = threading.Timer(30, stop.set)
    handled: list[str] = []
    batches: list[int] = []

    def handle(r: Received) -> None:
        handled.append(r.event.session_id)  # type: ignore[attr-defined]
        if len(handled) == 4:
            stop.set()

    group = unique_group("own-offsets")
    consumer = EventConsumer(bus_config, group, ["sessions"])
    timer.start()
    try:
        consumer.run(handle, stop, on_batch=lambda batch: batches.append(len(batch)), commit=False)
    finally:
        timer.cancel()
        consumer.close()  # a commit here finds nothing marked
    assert sorted(handled) == ["s0", "s1", "s2", "s3"] and sum(batches) == 4
    assert set(resumes_at(bus_config, group).values()) == {0}
