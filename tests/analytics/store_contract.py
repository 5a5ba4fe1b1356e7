"""What every `AnalyticsStore` backend must do, as one test suite each backend subclasses (the backend's
module supplies `make_store` / `reopen`): tables, idempotent inserts, persistence, the ledger, and every
canned query on hand-made events with known answers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.analytics.errors import AnalyticsError
from infra.analytics.queries import CANNED, render
from infra.analytics.rows import rows_of
from infra.analytics.store import AnalyticsStore
from infra.analytics.tables import BY_NAME, EVENT_TABLES
from schemas import events as ev
from tests.analytics.analytics_helpers import (
    T0,
    ingest,
    llm_call,
    segment,
    timeline,
    train_completed,
    trajectory,
)
from tests.factories import ALL_EVENT_TYPES, example


class StoreContract(ABC):
    @abstractmethod
    def make_store(self, tmp_path: Path) -> AnalyticsStore:
        """A fresh, empty store with its tables created."""

    @abstractmethod
    def reopen(self, store: AnalyticsStore) -> AnalyticsStore:
        """Closes `store` and opens the same data again (a new process would see the same)."""

    def dispose(self, store: AnalyticsStore) -> None:
        store.close()

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[AnalyticsStore]:
        self._open = [self.make_store(tmp_path)]
        try:
            yield self._open[0]
        finally:
            self.dispose(self._open[-1])

    def _reopen(self, store: AnalyticsStore) -> AnalyticsStore:
        """Reopens the fixture's store; the fixture then disposes of the new one."""
        self._open.append(self.reopen(store))
        return self._open[-1]

    # --- tables ---------------------------------------------------------------------------------

    def test_create_tables_is_idempotent_and_makes_every_table(self, store: AnalyticsStore) -> None:
        store.create_tables()
        result = store.query(
            "SELECT name, engine, sorting_key FROM system.tables WHERE database = {db:String} ORDER BY name",
            {"db": store.database},
        )
        tables = {name: (engine, key) for name, engine, key in result.rows}
        assert set(tables) == set(BY_NAME)
        assert all(engine == "ReplacingMergeTree" for engine, _ in tables.values())
        for t in EVENT_TABLES:
            assert tables[t.name][1].startswith("ts, event_id"), t.name

    def test_every_event_type_becomes_rows_carrying_the_envelope(self, store: AnalyticsStore) -> None:
        events = [example(cls, i) for i, cls in enumerate(ALL_EVENT_TYPES)]
        ingest(store, events)
        expected = Counter(rows_of(e, "t", 0, 0)[0][0] for e in events)
        counts = store.counts()
        for name, n in expected.items():
            assert counts[name] == n, name
        assert counts["llm_call_segments"] == 2  # the example LLMCall has two segments
        assert sum(n for name, n in counts.items() if name != "llm_call_segments") == len(events)
        row = store.query("SELECT event_id, topic, partition, offset, event_type FROM {db}.weights FINAL "
                          "WHERE event_type = 'WeightsLoaded'").dicts()[0]
        loaded = next(e for e in events if isinstance(e, ev.WeightsLoaded))
        assert row == {"event_id": loaded.event_id, "topic": "sf.weights", "partition": 0,
                       "offset": row["offset"], "event_type": "WeightsLoaded"}

    def test_llm_call_row_summarises_the_call(self, store: AnalyticsStore) -> None:
        call = llm_call("s1", "a", [segment("r0", 3, 4, T0, T0 + 100, finish="abort"),
                                    segment("r1", 4, 6, T0 + 200, T0 + 500, start=4)], drift=True, prompt=7)
        ingest(store, [call])
        row = store.query("SELECT * FROM {db}.llm_calls FINAL").dicts()[0]
        assert (row["prompt_tokens"], row["output_tokens"], row["min_version"], row["max_version"]) == (7, 10, 3, 4)
        assert (row["resource_id"], row["segments"], row["drift"], row["latency_ms"]) == ("r1", 2, True, 1000)
        assert row["ts"] == "2023-11-14 22:14:00.000"
        segs = store.query("SELECT segment_index, resource_id, version, num_tokens, duration_ms "
                           "FROM {db}.llm_call_segments FINAL ORDER BY segment_index").rows
        assert segs == [(0, "r0", 3, 4, 100), (1, "r1", 4, 6, 300)]

    # --- idempotence, persistence, ledger ---------------------------------------------------------

    def test_inserting_rows_twice_is_one_row_in_queries(self, store: AnalyticsStore) -> None:
        events = [example(ev.SessionStarted, i) for i in range(5)]
        rows = [rows_of(e, "sf.sessions", 0, i)[0][1] for i, e in enumerate(events)]
        store.insert("sessions", rows)
        store.insert("sessions", rows[2:])
        assert store.count("sessions") == 5
        assert store.count("sessions", final=False) == 8
        store.compact()
        assert store.count("sessions", final=False) == 5

    def test_rows_must_match_the_table_columns(self, store: AnalyticsStore) -> None:
        row = rows_of(example(ev.Heartbeat), "sf.resources", 0, 0)[0][1]
        with pytest.raises(AnalyticsError, match="missing columns"):
            store.insert("heartbeats", [{k: v for k, v in row.items() if k != "activity"}])
        with pytest.raises(AnalyticsError, match="no analytics table"):
            store.insert("nope", [row])

    def test_rows_persist_when_the_store_is_reopened(self, store: AnalyticsStore) -> None:
        ingest(store, [example(ev.MetricSample, i) for i in range(3)])
        store = self._reopen(store)
        assert store.count("metrics") == 3
        assert store.stored_offsets() == {("sf.metrics", 0): max(store.query(
            "SELECT max(offset) FROM {db}.metrics").scalar(), 0) + 1}

    def test_ledger_keeps_the_latest_offset_per_partition(self, store: AnalyticsStore) -> None:
        store.record_offsets({("sf.a", 0): 10, ("sf.a", 1): 3}, T0)
        store.record_offsets({("sf.a", 0): 25}, T0 + 1)
        assert store.stored_offsets() == {("sf.a", 0): 25, ("sf.a", 1): 3}
        store.record_offsets({("sf.a", 0): 4}, T0 + 2)  # a reset (the topic was recreated)
        assert store.stored_offsets() == {("sf.a", 0): 4, ("sf.a", 1): 3}

    def test_contains_finds_a_stored_event_by_time_and_id(self, store: AnalyticsStore) -> None:
        e = example(ev.Heartbeat, 1)
        ingest(store, [e])
        assert store.contains("heartbeats", e.ts_ms, e.event_id)
        assert not store.contains("heartbeats", e.ts_ms, "other")
        assert not store.contains("heartbeats", e.ts_ms + 1, e.event_id)

    def test_query_errors_are_analytics_errors(self, store: AnalyticsStore) -> None:
        with pytest.raises(AnalyticsError):
            store.query("SELECT nosuch FROM {db}.llm_calls")

    # --- canned queries: known answers ------------------------------------------------------------

    def test_rollout_throughput_per_resource_and_version(self, store: AnalyticsStore) -> None:
        ingest(store, [
            # r0: 150 tokens, one after the other over 2 s -> 75 tokens/s
            llm_call("s1", "a", [segment("r0", 1, 100, T0, T0 + 1000)]),
            llm_call("s1", "a", [segment("r0", 2, 50, T0 + 1000, T0 + 2000)]),
            # r1: two concurrent requests of 100 tokens in the same second -> 200 tokens/s, 100 per request
            llm_call("s2", "b", [segment("r1", 2, 100, T0, T0 + 1000)]),
            llm_call("s3", "b", [segment("r1", 2, 100, T0, T0 + 1000)]),
        ])
        by_resource = CANNED["rollout-throughput"].run(store)
        assert by_resource.title == "Rollout tokens/s per resource"
        rows = {r["resource"]: r for r in by_resource.dicts()}
        assert (rows["r0"]["tokens"], rows["r0"]["span_s"], rows["r0"]["tokens_per_s"]) == (150, 2, 75)
        assert rows["r0"]["tokens_per_s_per_request"] == 75
        assert (rows["r1"]["tokens"], rows["r1"]["tokens_per_s"], rows["r1"]["tokens_per_s_per_request"]) == (
            200, 200, 100)
        by_version = {r["policy_version"]: r for r in CANNED["rollout-throughput-by-version"].run(store).dicts()}
        assert by_version[1]["tokens"] == 100 and by_version[1]["tokens_per_s"] == 100
        assert (by_version[2]["segments"], by_version[2]["tokens"], by_version[2]["tokens_per_s"]) == (3, 250, 125)

    def _two_resource_timelines(self) -> list[ev.Event]:
        # r0: rollout 0-30 s, idle 30-45 s, rollout 45-60 s
        # r1: train 0-20 s, weight_sync 20-30 s, rollout 30-50 s, idle 50-60 s
        return [
            *timeline("r0", [(0, "rollout"), (30, "idle"), (45, "rollout")]),
            *timeline("r1", [(0, "train"), (20, "weight_sync"), (30, "rollout"), (50, "idle")]),
        ]

    def test_utilisation_and_bubble_from_tag_transitions(self, store: AnalyticsStore) -> None:
        ingest(store, self._two_resource_timelines())
        one = {r["resource"]: r for r in CANNED["utilisation"].run(store, bucket_s=60, until_ms=T0 + 60_000).dicts()}
        assert set(one) == {"r0", "r1"}
        assert (one["r0"]["observed_s"], one["r0"]["utilisation"], one["r0"]["bubble"]) == (60, 0.75, 0.25)
        r1 = one["r1"]
        assert (r1["utilisation"], r1["bubble"], r1["weight_sync"]) == (0.6667, 0.1667, 0.1667)
        assert (r1["train"], r1["rollout"], r1["offline"]) == (0.3333, 0.3333, 0)
        assert one["r0"]["bucket"] == "2023-11-14 22:14:00.000"
        halves = CANNED["utilisation"].run(store, bucket_s="30", until_ms=str(T0 + 60_000))
        r0 = [(r["bucket"][-12:], r["utilisation"], r["bubble"]) for r in halves.dicts() if r["resource"] == "r0"]
        assert r0 == [("22:14:00.000", 1, 0), ("22:14:30.000", 0.5, 0.5)]

    def test_utilisation_runs_to_the_newest_heartbeat_by_default(self, store: AnalyticsStore) -> None:
        beat = ev.Heartbeat(resource_id="r0", activity="rollout", weight_version=1, running_requests=1,
                            queued_requests=0, tokens_generated=5, ts_ms=T0 + 60_000)
        ingest(store, [*self._two_resource_timelines(), beat])
        rows = {r["resource"]: r for r in CANNED["utilisation"].run(store).dicts()}
        assert (rows["r0"]["utilisation"], rows["r1"]["bubble"]) == (0.75, 0.1667)

    def test_weight_sync_pauses(self, store: AnalyticsStore) -> None:
        ingest(store, [
            ev.WeightsPublished(model="m", version=3, uri="file:///w3", sha256="x", step=2, ts_ms=T0),
            ev.WeightsLoaded(model="m", resource_id="r0", version=3, pause_ms=40.0, load_ms=30.0, ts_ms=T0 + 100),
            ev.WeightsLoaded(model="m", resource_id="r1", version=3, pause_ms=60.0, load_ms=50.0, ts_ms=T0 + 250),
            ev.WeightsPublished(model="m", version=4, uri="file:///w4", sha256="y", step=3, ts_ms=T0 + 5000),
            ev.WeightSyncStarted(model="m", sync_id="s3", version=3, resource_ids=("r0", "r1"), ts_ms=T0 + 20),
            ev.WeightSyncCompleted(model="m", sync_id="s3", version=3, resource_ids=("r0", "r1"), ts_ms=T0 + 270),
        ])
        rows = CANNED["weight-sync"].run(store).dicts()
        assert [(r["version"], r["loads"]) for r in rows] == [(3, 2), (4, 0)]
        v3 = rows[0]
        assert (v3["mean_pause_ms"], v3["p50_pause_ms"], v3["max_pause_ms"], v3["mean_load_ms"]) == (50, 50, 60, 40)
        assert (v3["publish_to_last_load_ms"], v3["sync_ms"]) == (250, 250)
        assert rows[1]["mean_pause_ms"] is None and rows[1]["sync_ms"] is None
        assert rows[1]["published_at"] == "2023-11-14 22:14:05.000"

    def test_staleness_from_train_step_histograms(self, store: AnalyticsStore) -> None:
        ingest(store, [train_completed(1, 2, [5, 3]), train_completed(2, 3, [1, 1, 2])])
        rows = CANNED["staleness"].run(store).rows
        assert [tuple(r) for r in rows] == [(0, 6, 0.5), (1, 4, 0.3333), (2, 2, 0.1667)]

    def test_trajectory_staleness_against_the_consuming_step(self, store: AnalyticsStore) -> None:
        ingest(store, [
            trajectory("t1", 1, 2), trajectory("t2", 3, 3), trajectory("t3", 2, 3), trajectory("unused", 0, 0),
            train_completed(7, 4, trajectories=["t1", "t2", "t3"]),  # trained from version 3
        ])
        rows = [tuple(r) for r in CANNED["trajectory-staleness"].run(store).rows]
        assert rows == [(0, 1, 0.3333, 0), (1, 1, 0.3333, 0), (2, 1, 0.3333, 1)]

    def test_drift_counts_per_agent(self, store: AnalyticsStore) -> None:
        seg = [segment("r0", 1, 3, T0, T0 + 10)]
        ingest(store, [
            llm_call("s1", "alpha", seg), llm_call("s1", "alpha", seg, drift=True), llm_call("s2", "alpha", seg),
            llm_call("s3", "beta", seg),
        ])
        rows = [tuple(r) for r in CANNED["drift"].run(store).rows]
        assert rows == [("alpha", 3, 1, 0.3333, 2, 1), ("beta", 1, 0, 0, 1, 0)]

    def test_reward_per_step(self, store: AnalyticsStore) -> None:
        ingest(store, [
            train_completed(2, 3, reward=0.75, loss=0.5), train_completed(1, 2, reward=0.25, loss=0.9),
            ev.TrainStepStarted(run_id="run", step=3, policy_version=3, num_trajectories=4, num_tokens=10),
        ])
        rows = CANNED["reward"].run(store).dicts()
        assert [(r["step"], r["new_version"], r["reward"], r["loss"]) for r in rows] == [
            (1, 2, 0.25, 0.9), (2, 3, 0.75, 0.5)]

    def test_scheduler_decisions_per_resource(self, store: AnalyticsStore) -> None:
        ingest(store, [
            *timeline("r0", [(0, "rollout"), (10, "train")]),
            ev.Preemption(resource_id="r0", preempted_task="rollout", by_task="train", assignment_id="a1",
                          reason="train_step", ts_ms=T0 + 10_000),
            ev.Assignment(assignment_id="a1", task_kind="train", resource_ids=("r0", "r1"), step=1,
                          policy_version=1, ts_ms=T0 + 10_000),
        ])
        rows = [tuple(r) for r in CANNED["scheduler"].run(store).rows]
        assert rows == [("r0", 1, 1, 2, 0), ("r1", 0, 1, 0, 0)]

    def test_event_counts_match_the_store(self, store: AnalyticsStore) -> None:
        ingest(store, [example(cls, i) for i, cls in enumerate(ALL_EVENT_TYPES)])
        result = CANNED["event-counts"].run(store)
        assert {r["table"]: r["rows"] for r in result.dicts()} == store.counts()
        assert all(r["rows"] == r["stored_rows"] for r in result.dicts())

    def test_every_canned_query_runs_on_an_empty_store_and_renders(self, store: AnalyticsStore) -> None:
        for name, query in CANNED.items():
            result = query.run(store)
            table = render(result)
            assert table.title == query.title, name
            assert [c.header for c in table.columns] == list(result.columns), name

    def test_query_parameters_are_checked(self, store: AnalyticsStore) -> None:
        with pytest.raises(AnalyticsError, match="no parameter"):
            CANNED["utilisation"].run(store, bucket=5)
        with pytest.raises(AnalyticsError, match="is not a int"):
            CANNED["utilisation"].run(store, bucket_s="soon")

