"""The sink's writer without Kafka: rows first, ledger second, and what a restarted sink does with events it
reads again (skips what the ledger covers, rewrites the rest, which FINAL collapses)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.analytics.errors import RowError
from infra.analytics.sink import AnalyticsWriter
from infra.analytics.store import ChdbStore, TopicPartition
from schemas import events as ev
from tests.analytics.analytics_helpers import received
from tests.factories import example

pytestmark = pytest.mark.unit


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChdbStore]:
    s = ChdbStore(tmp_path / "chdb")
    try:
        yield s
    finally:
        s.close()


def sessions(n: int, start: int = 0) -> list[ev.SessionStarted]:
    return [example(ev.SessionStarted, i, session_id=f"s{i}") for i in range(start, start + n)]


def feed(writer: AnalyticsWriter, events: list[ev.SessionStarted], first_offset: int = 0) -> list[bool]:
    return [writer.add(received(e, offset=first_offset + i)) for i, e in enumerate(events)]


def test_flush_writes_rows_then_ledger_and_returns_events_in_read_order(store: ChdbStore) -> None:
    writer = AnalyticsWriter(store)
    events = sessions(5)
    feed(writer, events)
    assert writer.pending == 5 and store.count("sessions") == 0
    handled = writer.flush()
    assert [r.offset for r in handled] == [0, 1, 2, 3, 4]
    assert store.count("sessions") == 5
    assert store.stored_offsets() == {("sf.sessions", 0): 5}
    assert writer.pending == 0 and writer.flush() == []


def test_restart_skips_events_the_ledger_covers(store: ChdbStore) -> None:
    events = sessions(10)
    first = AnalyticsWriter(store)
    feed(first, events[:6])
    first.flush()
    # the sink died after recording the ledger but before committing to Kafka: it reads offsets 0.. again
    second = AnalyticsWriter(store)
    stored = feed(second, events)
    second.flush()
    assert stored == [False] * 6 + [True] * 4
    assert second.stats.skipped == 6
    assert store.count("sessions", final=False) == 10  # no physical duplicate either
    assert store.stored_offsets() == {("sf.sessions", 0): 10}


def test_restart_after_rows_but_before_ledger_rewrites_and_final_collapses(store: ChdbStore) -> None:
    events = sessions(8)
    first = AnalyticsWriter(store)
    feed(first, events[:5])
    first.flush()

    @dataclass
    class Killed(Exception):
        at: str

    def die(offsets: Mapping[TopicPartition, int], now_ms: int) -> None:
        raise Killed("ledger")

    crashing = AnalyticsWriter(store)
    feed(crashing, events[5:], first_offset=5)
    store.record_offsets, real = die, store.record_offsets  # type: ignore[method-assign]
    with pytest.raises(Killed):
        crashing.flush()  # rows of offsets 5..7 are stored, the ledger still says 5
    store.record_offsets = real  # type: ignore[method-assign]
    again = AnalyticsWriter(store)
    assert feed(again, events[5:], first_offset=5) == [True] * 3
    again.flush()
    assert store.count("sessions", final=False) == 11
    assert store.count("sessions") == 8
    assert store.query("SELECT uniqExact(event_id) FROM {db}.sessions FINAL").scalar() == 8


def test_a_ledger_from_a_recreated_topic_is_ignored(store: ChdbStore, caplog: pytest.LogCaptureFixture) -> None:
    store.record_offsets({("sf.sessions", 0): 100}, 0)  # offsets of an older topic of the same name
    writer = AnalyticsWriter(store)
    events = sessions(5)
    with caplog.at_level(logging.WARNING, logger="sflow.analytics"):
        stored = feed(writer, events[:3])
    writer.flush()
    assert stored == [True, True, True]
    assert store.count("sessions") == 3
    assert "recreated" in caplog.text
    assert store.stored_offsets() == {("sf.sessions", 0): 3}  # moved back: the latest record wins
    again = AnalyticsWriter(store)
    assert feed(again, events) == [False, False, False, True, True]


def test_an_event_that_cannot_become_rows_raises_and_its_offset_still_counts(store: ChdbStore) -> None:
    writer = AnalyticsWriter(store)
    writer.add(received(sessions(1)[0], offset=0))
    broken = example(ev.LLMCall, 1)
    object.__setattr__(broken, "segments", None)  # what a decoder bug would hand over
    with pytest.raises(RowError, match="LLMCall"):
        writer.add(received(broken, offset=1))
    handled = writer.flush()
    assert [r.offset for r in handled] == [0, 1]
    assert writer.stats.dead_lettered == 1
    assert store.stored_offsets() == {("sf.sessions", 0): 1, ("sf.llm.calls", 0): 2}


def test_an_event_type_without_a_table_is_kept_as_json(store: ChdbStore) -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class FutureEvent(ev.Event):
        answer: int = 42

    writer = AnalyticsWriter(store)
    future = FutureEvent(correlation_id="c")
    writer.add(dataclasses.replace(received(sessions(1)[0], offset=0), event=future))
    writer.flush()
    row = store.query("SELECT event_type, body FROM {db}.other_events FINAL").rows
    assert row[0][0] == "FutureEvent" and '"answer":42' in row[0][1]


def test_llm_call_with_segments_writes_into_two_tables(store: ChdbStore) -> None:
    writer = AnalyticsWriter(store)
    writer.add(received(example(ev.LLMCall, 3)))
    writer.flush()
    assert (store.count("llm_calls"), store.count("llm_call_segments")) == (1, 2)
    assert dict(writer.stats.rows_by_table) == {"llm_calls": 1, "llm_call_segments": 2}


def test_train_steps_keep_the_step_metrics_and_the_health_query_shows_them(store: ChdbStore) -> None:
    from infra.analytics.queries import CANNED

    writer = AnalyticsWriter(store)
    started = example(ev.TrainStepStarted, 1, run_id="r", step=1)
    done = example(ev.TrainStepCompleted, 2, run_id="r", step=1, entropy=1.25, response_length_mean=79.5,
                   clip_fraction_low=0.01, clip_fraction_high=0.02, truncated_fraction=0.75,
                   zero_variance_fraction=1.0, filtered_group_ids=("g1", "g2"),
                   collapse_signals=("length_runaway: x", "zero_variance: y"))
    skipped = example(ev.TrainStepCompleted, 3, run_id="r", step=2, status="skipped")
    for i, e in enumerate((started, done, skipped)):
        writer.add(received(e, offset=i))
    writer.flush()
    assert store.count("train_steps") == 3
    [row] = CANNED["health"].run(store).dicts()
    assert (row["step"], row["entropy"], row["response_length"], row["truncated"]) == (1, 1.25, 79.5, 0.75)
    assert (row["zero_variance"], row["clip_low"], row["clip_high"], row["filtered"]) == (1.0, 0.01, 0.02, 2)
    assert row["collapse"] == "length_runaway: x; zero_variance: y"


def test_evaluations_are_stored_with_their_versions_and_the_eval_query_shows_them(store: ChdbStore) -> None:
    from infra.analytics.queries import CANNED

    writer = AnalyticsWriter(store)
    start = example(ev.EvalCompleted, 1, run_id="r", step=0, trigger="start", accuracy=0.25, reward_mean=0.5,
                    versions=(0,), task_scores=(0.0, 1.0), failed=0)
    end = example(ev.EvalCompleted, 2, run_id="r", step=40, trigger="end", accuracy=0.75, reward_mean=0.8,
                  versions=(39, 40), task_scores=(1.0, 0.5), failed=1)
    for i, e in enumerate((end, start, start)):  # a copy re-read collapses
        writer.add(received(e, offset=i))
    writer.flush()
    rows = CANNED["eval"].run(store).dicts()
    assert [(r["step"], r["trigger"], r["accuracy"], r["versions"], r["pinned"], r["failed"]) for r in rows] == [
        (0, "start", 0.25, "0", True, 0), (40, "end", 0.75, "39, 40", False, 1)]
