"""The processor's two stages driven without Faust: a dict as the table, a list as what was published."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from agents_adapter.processor.config import ProcessorConfig
from agents_adapter.processor.group_stage import GroupStage
from agents_adapter.processor.prefix_tree import PrefixTree
from agents_adapter.processor.session_records import CloseMarker
from agents_adapter.processor.session_stage import TICK_METRIC, Output, SessionStage
from agents_adapter.processor.table_codec import CLOSED, DELTA, FIRED, GROUP, GroupRecord, TableKey
from schemas.events import BatchReady, Event, Heartbeat, LLMCall, MetricSample, SessionEnded, SessionStarted, Trajectory
from tests.unit.trajectory.sessiongen import make_call

pytestmark = pytest.mark.unit

CALLS, SESSIONS, TICKS = "t.llm.calls", "t.sessions", "t.trajectory-processor-ticks"


class RecordingTable(dict[bytes, bytes]):
    """A plain mapping that also logs each write, in order: ("put" | "del", parsed key)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, TableKey]] = []

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.writes.append(("put", TableKey.from_bytes(key)))
        super().__setitem__(key, value)

    def __delitem__(self, key: bytes) -> None:
        self.writes.append(("del", TableKey.from_bytes(key)))
        super().__delitem__(key)


def stages(table: RecordingTable | None = None, **config: object) -> tuple[SessionStage, RecordingTable, list[Output]]:
    published: list[Output] = []

    async def publish(output: Output) -> None:
        published.append(output)

    table = RecordingTable() if table is None else table
    return SessionStage(ProcessorConfig(**config), table, publish, TICKS), table, published


def session(sid: str, group: str = "g1", *, n_samples: int | None = None) -> list[Event]:
    meta = {"n_samples": str(n_samples)} if n_samples else {}
    calls = [make_call(f"{sid}-a", [1, 2, 3], [4, 5], session_id=sid, group_id=group, ts_ms=1_000),
             make_call(f"{sid}-b", [1, 2, 3, 4, 5, 6], [7], session_id=sid, group_id=group, ts_ms=2_000, turn=1)]
    return [SessionStarted(session_id=sid, agent_id="a", task_id="task-1", group_id=group, metadata=meta, ts_ms=500),
            *calls,
            SessionEnded(session_id=sid, agent_id="a", task_id="task-1", group_id=group, reward=1.0, num_calls=2,
                         ts_ms=3_000)]


def feed(stage: SessionStage, events: Iterable[Event], p: int = 0) -> list[str | None]:
    async def run() -> list[str | None]:
        return [await stage.on_input(p, CALLS if isinstance(e, LLMCall) else SESSIONS, e) for e in events]

    return asyncio.run(run())


def tree_of(events: Iterable[Event]) -> PrefixTree:
    tree = PrefixTree()
    for e in events:
        if isinstance(e, LLMCall):
            tree.insert(e)
    return tree


def test_a_closed_session_publishes_its_trajectory_then_its_group_record_and_leaves_only_a_marker() -> None:
    stage, table, published = stages()
    events = session("s1", n_samples=2)
    assert feed(stage, events) == [None] * 4
    trajectory, record = published
    assert isinstance(trajectory, Trajectory) and trajectory.nodes == tree_of(events).nodes()
    assert record == GroupRecord("member", "g1", "task-1", 2, "s1", trajectory.min_version, trajectory.max_version,
                                 trajectory.ts_ms)
    assert [TableKey.from_bytes(k) for k in table] == [TableKey(CLOSED, 0, "s1")]
    assert CloseMarker.from_bytes(table[TableKey(CLOSED, 0, "s1").to_bytes()]) == CloseMarker.of(
        trajectory.ts_ms, trajectory.call_ids)
    # the deltas of the inputs before the close, then the marker, then the deletes of the deltas
    assert table.writes == [("put", TableKey(DELTA, 0, "s1", seq)) for seq in range(3)] + [
        ("put", TableKey(CLOSED, 0, "s1"))] + [("del", TableKey(DELTA, 0, "s1", seq)) for seq in range(3)]


def test_a_stage_rebuilt_from_the_table_finishes_the_open_sessions_like_the_core() -> None:
    events = session("s1")
    stage, table, _ = stages()
    feed(stage, events[:2], p=3)  # started + one call
    restarted, _, published = stages(table)
    restarted.rebuild(resync=False)
    assert feed(restarted, events[1:], p=3) == [None] * 3  # the re-read call is a duplicate
    trajectory, record = published  # a group record of size 0: the session did not say its group's size
    assert isinstance(trajectory, Trajectory) and trajectory.nodes == tree_of(events).nodes()
    assert isinstance(record, GroupRecord) and (record.kind, record.size, record.trajectory_id) == ("member", 0, "s1")
    assert trajectory.call_ids == ("s1-a", "s1-b")


def test_rejected_and_unexpected_inputs_are_named_for_the_dead_letters_and_change_nothing() -> None:
    stage, table, published = stages()
    bad = make_call("s1-bad", [1], [2, 3], [-0.5], session_id="s1")
    heartbeat = Heartbeat(resource_id="r0", activity="idle", weight_version=0, running_requests=0,
                          queued_requests=0, tokens_generated=0)
    reasons = feed(stage, [bad])
    reasons.append(asyncio.run(stage.on_input(0, SESSIONS, heartbeat)))
    assert reasons[0] is not None and reasons[0].startswith("rejected call: call 's1-bad'")
    assert reasons[1] == f"unexpected Heartbeat on {SESSIONS}"
    assert (dict(table), published) == ({}, [])


def test_a_tick_closes_the_silent_sessions_of_its_partition_as_timeouts() -> None:
    stage, table, published = stages(ttl_ms=1_000)
    feed(stage, session("s1")[:2], p=1)
    tick = MetricSample(service="tp", name=TICK_METRIC, value=0.0, ts_ms=1_000 + 1_000)
    assert asyncio.run(stage.on_input(1, TICKS, tick)) is None
    trajectory, _ = published
    assert isinstance(trajectory, Trajectory) and (trajectory.status, trajectory.ts_ms) == ("timeout", 2_000)
    assert [TableKey.from_bytes(k) for k in table] == [TableKey(CLOSED, 1, "s1")]


def group_stage(table: RecordingTable | None = None) -> tuple[GroupStage, RecordingTable, list[Output]]:
    published: list[Output] = []

    async def publish(output: Output) -> None:
        published.append(output)

    table = RecordingTable() if table is None else table
    return GroupStage(ProcessorConfig(), table, publish), table, published


def member(gid: str, tid: str, version: int, ts_ms: int, size: int = 0) -> GroupRecord:
    return GroupRecord("member", gid, "task-1", size, tid, version, version, ts_ms)


def test_a_group_fires_one_batch_when_it_fills_and_keeps_only_its_fired_marker() -> None:
    stage, table, published = group_stage()

    async def run() -> None:
        await stage.on_record(2, GroupRecord("size", "g1", "task-1", 3))
        await stage.on_record(2, member("g1", "t-b", 1, 200))
        await stage.on_record(2, member("g1", "t-a", 0, 100))
        assert published == []
        await stage.on_record(2, member("g1", "t-c", 2, 300))
        await stage.on_record(2, member("g1", "t-d", 2, 400))  # late: the group fired

    asyncio.run(run())
    (batch,) = published
    assert isinstance(batch, BatchReady)
    assert (batch.trajectory_ids, batch.num_samples, batch.task_id) == (("t-a", "t-b", "t-c"), 3, "task-1")
    assert (batch.min_version, batch.max_version, batch.ts_ms) == (0, 2, 300)
    assert [TableKey.from_bytes(k) for k in table] == [TableKey(FIRED, 2, "g1")]
    assert table.writes[-2:] == [("put", TableKey(FIRED, 2, "g1")), ("del", TableKey(GROUP, 2, "g1"))]


def test_a_pending_group_restored_from_the_table_fires_when_its_last_member_arrives() -> None:
    stage, table, _ = group_stage()
    asyncio.run(stage.on_record(0, member("g1", "t-a", 0, 100, size=2)))
    restarted, _, published = group_stage(table)
    restarted.rebuild(resync=False)
    asyncio.run(restarted.on_record(0, member("g1", "t-b", 1, 200)))
    (batch,) = published
    assert isinstance(batch, BatchReady) and batch.trajectory_ids == ("t-a", "t-b")
