"""TrajectoryAssembler and GroupTracker: one deterministic trajectory per session, TTL, late calls, groups."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_adapter.errors import ConfigError, DeltaError, LateCallError, MalformedCallError
from agents_adapter.processor.assembler import AssemblerConfig, Emitted, TrajectoryAssembler
from agents_adapter.processor.group_tracker import GroupTracker, batch_event_id
from agents_adapter.processor.prefix_tree import PrefixTree
from agents_adapter.processor.session_records import (
    NAMESPACE,
    CloseMarker,
    SessionDelta,
    call_digest,
    trajectory_event_id,
)
from schemas.events import (
    LLMCall,
    SessionEnded,
    SessionStarted,
    SessionStatus,
    decode_event,
    encode_event,
)
from tests.unit.trajectory.sessiongen import make_call, sessions

pytestmark = pytest.mark.unit

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TTL = 60_000


def ended(session_id: str = "s1", *, ts_ms: int = 5_000, num_calls: int = 0, reward: float = 1.0,
          group_id: str = "g1", status: SessionStatus = SessionStatus.COMPLETED) -> SessionEnded:
    return SessionEnded(event_id=f"end-{session_id}-{ts_ms}", ts_ms=ts_ms, producer="adapter-0",
                        correlation_id=session_id, session_id=session_id, agent_id="agent-1", task_id="task-1",
                        group_id=group_id, reward=reward, status=status, num_calls=num_calls)


def started(session_id: str = "s1", *, ts_ms: int = 500, group_id: str = "g1", **metadata: str) -> SessionStarted:
    return SessionStarted(event_id=f"start-{session_id}", ts_ms=ts_ms, producer="adapter-0",
                          correlation_id=session_id, session_id=session_id, agent_id="agent-1", task_id="task-1",
                          group_id=group_id, metadata=metadata)


def feed(assembler: TrajectoryAssembler, events) -> Emitted:
    out = Emitted()
    for event in events:
        out += assembler.on_event(event)
    return out


def two_turns(session_id: str = "s1", group_id: str = "g1") -> list[LLMCall]:
    return [
        make_call(f"{session_id}-a", [1, 2, 3], [4, 5], [-0.5, -0.25], [3, 3], session_id=session_id,
                  group_id=group_id, ts_ms=1_000),
        make_call(f"{session_id}-b", [1, 2, 3, 4, 5, 6], [7], [-1.0], [4], session_id=session_id,
                  group_id=group_id, ts_ms=2_000, turn=1),
    ]


def test_a_session_becomes_one_trajectory_with_derived_ids_and_time() -> None:
    assembler = TrajectoryAssembler(AssemblerConfig(producer="tp-0"))
    calls = two_turns()
    out = feed(assembler, [started(), *calls])
    assert len(out.deltas) == 3 and not out.trajectories
    out = assembler.on_session_ended(ended(num_calls=2))
    (trajectory,) = out.trajectories
    assert out.closed_sessions == ("s1",) and assembler.open_sessions == 0
    tree = PrefixTree()
    for call in calls:
        tree.insert(call)
    assert trajectory.event_id == uuid.uuid5(NAMESPACE, "Trajectory/s1").hex == trajectory_event_id("s1")
    assert (trajectory.ts_ms, trajectory.producer, trajectory.correlation_id) == (5_000, "tp-0", "s1")
    assert (trajectory.trajectory_id, trajectory.session_id, trajectory.group_id) == ("s1", "s1", "g1")
    assert (trajectory.reward, trajectory.status) == (1.0, "completed")
    assert trajectory.nodes == tree.nodes()
    assert trajectory.call_ids == ("s1-a", "s1-b")
    assert (trajectory.min_version, trajectory.max_version) == (3, 4)
    assert (trajectory.tokens_in_calls, trajectory.tokens_in_tree) == (12, 7)
    assert decode_event(encode_event(trajectory)) == trajectory


@FAST
@given(sessions())
def test_the_same_inputs_give_the_same_trajectory_bytes(calls) -> None:
    events = [started(), *calls, ended(num_calls=len(calls))]
    first = feed(TrajectoryAssembler(), events).trajectories
    second = feed(TrajectoryAssembler(), events).trajectories
    assert len(first) == 1
    assert encode_event(first[0]) == encode_event(second[0])
    # another order of the same calls: the same tree, only call_ids follow the order
    reordered = feed(TrajectoryAssembler(), [started(), *reversed(calls), ended(num_calls=len(calls))])
    assert reordered.trajectories[0].nodes == first[0].nodes


@FAST
@given(sessions(), st.data())
def test_an_assembler_restored_from_its_session_deltas_closes_the_same_trajectory(calls, data) -> None:
    cut = data.draw(st.integers(0, len(calls)))
    live = TrajectoryAssembler()
    log = [d.to_bytes() for d in feed(live, [started(n_samples="2"), *calls[:cut]]).deltas]
    restored = TrajectoryAssembler()
    for raw in log:
        restored.restore(SessionDelta.from_bytes(raw))
    tail = [*calls[cut:], ended(num_calls=len(calls))]
    a, b = feed(live, tail), feed(restored, tail)
    assert [encode_event(t) for t in a.trajectories] == [encode_event(t) for t in b.trajectories]
    assert [d.to_bytes() for d in a.deltas] == [d.to_bytes() for d in b.deltas]


def test_restore_refuses_a_gap_in_the_session_log() -> None:
    deltas = feed(TrajectoryAssembler(), two_turns()).deltas
    with pytest.raises(DeltaError):
        TrajectoryAssembler().restore(deltas[1])
    assembler = TrajectoryAssembler()
    assembler.restore(deltas[0])
    with pytest.raises(DeltaError):
        assembler.restore(deltas[0])


def test_duplicates_are_counted_and_change_nothing() -> None:
    assembler = TrajectoryAssembler()
    calls = two_turns()
    out = feed(assembler, [calls[0], calls[0], calls[1], calls[0]])
    assert len(out.deltas) == 2 and assembler.stats.duplicate_calls == 2
    first = assembler.on_session_ended(ended())
    again = assembler.on_session_ended(ended(ts_ms=9_000, reward=0.0))
    assert len(first.trajectories) == 1 and again == Emitted()
    assert assembler.stats.duplicate_ends == 1


def test_late_calls_are_refused_for_the_dead_letters_without_reopening_the_session() -> None:
    assembler = TrajectoryAssembler(AssemblerConfig(closed_retention_ms=10_000))
    calls = two_turns()
    feed(assembler, [calls[0], ended()])
    with pytest.raises(LateCallError, match="not in its trajectory of 1 calls"):
        assembler.on_call(calls[1])
    assert assembler.stats.late_calls == 1 and assembler.open_sessions == 0 and assembler.is_closed("s1")
    # after the retention a very late call opens a new session; its trajectory has the same event id
    # and trajectory id, so the consumers' dedup keeps the first one
    assembler.expire(now_ms=5_000 + 10_001, ttl_ms=TTL)
    assert not assembler.is_closed("s1")
    assembler.on_call(calls[1])
    (again,) = assembler.expire(now_ms=2_000 + TTL, ttl_ms=TTL).trajectories
    assert again.event_id == trajectory_event_id("s1") and again.status == "timeout"


def test_a_session_ended_before_its_last_call_waits_for_it() -> None:
    assembler = TrajectoryAssembler()
    calls = two_turns()
    assembler.on_call(calls[0])
    out = assembler.on_session_ended(ended(num_calls=2, ts_ms=1_500))
    assert not out.trajectories and len(out.deltas) == 1 and out.deltas[0].ended is not None
    (trajectory,) = assembler.on_call(calls[1]).trajectories
    assert trajectory.call_ids == ("s1-a", "s1-b") and trajectory.status == "completed"
    assert trajectory.ts_ms == 2_000  # the newest input


def test_a_waiting_session_closes_at_the_ttl_with_its_reported_reward() -> None:
    assembler = TrajectoryAssembler()
    assembler.on_call(two_turns()[0])
    assembler.on_session_ended(ended(num_calls=3, ts_ms=1_500, reward=0.5))
    assert assembler.expire(now_ms=1_500 + TTL - 1, ttl_ms=TTL) == Emitted()
    (trajectory,) = assembler.expire(now_ms=1_500 + TTL, ttl_ms=TTL).trajectories
    assert (trajectory.status, trajectory.reward, trajectory.ts_ms) == ("completed", 0.5, 1_500)
    assert assembler.stats.incomplete_closes == 1


def test_the_waiting_can_be_switched_off() -> None:
    assembler = TrajectoryAssembler(AssemblerConfig(wait_for_calls=False))
    assembler.on_call(two_turns()[0])
    assert len(assembler.on_session_ended(ended(num_calls=2)).trajectories) == 1


def test_expire_closes_silent_sessions_as_timeouts_oldest_first() -> None:
    assembler = TrajectoryAssembler()
    feed(assembler, [*two_turns("s1"), *two_turns("s2")[:1], started("s3", ts_ms=4_000)])
    assert assembler.expire(now_ms=1_000 + TTL - 1, ttl_ms=TTL) == Emitted()
    out = assembler.expire(now_ms=2_000 + TTL, ttl_ms=TTL)
    assert [t.session_id for t in out.trajectories] == ["s2", "s1"]
    assert [t.ts_ms for t in out.trajectories] == [1_000 + TTL, 2_000 + TTL]
    assert all(t.status == "timeout" and t.reward == 0.0 for t in out.trajectories)
    assert out.closed_sessions == ("s2", "s1") and assembler.open_sessions == 1
    assert assembler.expire(now_ms=2_000 + TTL, ttl_ms=TTL) == Emitted()
    (empty,) = assembler.expire(now_ms=4_000 + TTL, ttl_ms=TTL).trajectories
    assert empty.nodes == () and (empty.min_version, empty.max_version) == (-1, -1)
    assert assembler.stats.timeouts == 3
    with pytest.raises(ConfigError):
        assembler.expire(now_ms=0, ttl_ms=-1)


def test_a_rejected_call_raises_after_counting_and_leaves_no_session() -> None:
    assembler = TrajectoryAssembler()
    bad = make_call("bad", [1], [2, 3], [-0.5], [1, 1])
    with pytest.raises(MalformedCallError):
        assembler.on_call(bad)
    assert assembler.stats.rejected_calls == 1 and assembler.open_sessions == 0


def test_a_session_delta_round_trips_through_bytes() -> None:
    assembler = TrajectoryAssembler()
    assembler.on_call(two_turns()[0])
    (delta,) = assembler.on_session_ended(ended(num_calls=5)).deltas
    back = SessionDelta.from_bytes(delta.to_bytes())
    assert back.to_bytes() == delta.to_bytes()
    assert back.ended == delta.ended and back.seq == 1 and back.last_ts_ms == 5_000
    with pytest.raises(DeltaError):
        SessionDelta.from_bytes(delta.to_bytes()[:-3])
    with pytest.raises(DeltaError):
        SessionDelta.from_bytes(b"nope" + delta.to_bytes()[4:])


# --- groups ----------------------------------------------------------------------------------------


def close_group(assembler: TrajectoryAssembler, group_id: str, n: int, start: int = 0) -> Emitted:
    out = Emitted()
    for i in range(start, start + n):
        sid = f"{group_id}-s{i}"
        out += feed(assembler, [*two_turns(sid, group_id), ended(sid, group_id=group_id, ts_ms=5_000 + i)])
    return out


def test_a_group_fires_once_when_its_n_samples_are_in() -> None:
    assembler = TrajectoryAssembler(AssemblerConfig(group_size=3, producer="tp-0"))
    assert not close_group(assembler, "g1", 2).batches
    (batch,) = close_group(assembler, "g1", 1, start=2).batches
    assert batch.trajectory_ids == ("g1-s0", "g1-s1", "g1-s2") and batch.num_samples == 3
    assert (batch.group_id, batch.task_id, batch.min_version, batch.max_version) == ("g1", "task-1", 3, 4)
    assert (batch.event_id, batch.ts_ms, batch.ready_groups) == (batch_event_id("g1"), 5_002, 1)
    assert decode_event(encode_event(batch)) == batch
    assert not close_group(assembler, "g1", 1, start=3).batches
    assert assembler.tracker.late_samples == 1


def test_the_group_size_comes_from_session_metadata_before_the_config() -> None:
    assembler = TrajectoryAssembler(AssemblerConfig(group_size=4))
    assembler.on_session_started(started("g1-s0", n_samples="2"))
    assert not close_group(assembler, "g1", 1).batches
    assert len(close_group(assembler, "g1", 1, start=1).batches) == 1


def test_a_metadata_size_counts_even_when_the_group_id_comes_later() -> None:
    assembler = TrajectoryAssembler(AssemblerConfig(group_size=1))
    assembler.on_session_started(started("g1-s0", group_id="", n_samples="2"))
    assert not close_group(assembler, "g1", 1).batches
    assert len(close_group(assembler, "g1", 1, start=1).batches) == 1


def test_bad_metadata_sizes_are_ignored() -> None:
    assembler = TrajectoryAssembler(AssemblerConfig(group_size=1))
    assembler.on_session_started(started("g1-s0", n_samples="two"))
    assert len(close_group(assembler, "g1", 1).batches) == 1


def test_expect_after_the_samples_fires_and_duplicates_do_not_count() -> None:
    tracker = GroupTracker()
    trajectories = [t for i in range(3) for t in close_group(TrajectoryAssembler(), "g9", 1, start=i).trajectories]
    assert tracker.add(trajectories[0]) is None and tracker.add(trajectories[0]) is None
    assert tracker.add(trajectories[1]) is None
    assert tracker.duplicate_samples == 1 and tracker.pending("g9") == 2
    batch = tracker.expect("g9", 2)
    assert batch is not None and batch.num_samples == 2
    assert tracker.add(trajectories[2]) is None and tracker.late_samples == 1
    assert tracker.forget(before_ts_ms=10**12) == 1


def test_trajectories_without_a_group_never_batch() -> None:
    assembler = TrajectoryAssembler(AssemblerConfig(group_size=1))
    out = feed(assembler, [*two_turns("s1", group_id=""), ended("s1", group_id="")])
    assert len(out.trajectories) == 1 and not out.batches


@pytest.mark.parametrize(
    "kwargs",
    [{"producer": ""}, {"group_size": 0}, {"group_size_key": ""}, {"closed_retention_ms": -1}],
)
def test_bad_config_names_the_field(kwargs) -> None:
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        AssemblerConfig(**kwargs)



@FAST
@given(sessions(), st.data())
def test_where_session_ended_lands_among_the_calls_does_not_change_the_bytes(calls, data) -> None:
    # llm.calls and sessions are different topics: the end may be read before the last calls
    end = ended(num_calls=len(calls))
    reference = feed(TrajectoryAssembler(), [*calls, end]).trajectories
    at = data.draw(st.integers(0, len(calls)))
    early = feed(TrajectoryAssembler(), [*calls[:at], end, *calls[at:]]).trajectories
    assert len(early) == len(reference) == 1
    assert encode_event(early[0]) == encode_event(reference[0])


def test_a_closed_sessions_own_calls_read_again_are_redelivered_not_late() -> None:
    """After a restart a worker re-reads calls of sessions it already closed: they are in the trajectory."""
    assembler = TrajectoryAssembler()
    calls = two_turns()
    (trajectory,) = feed(assembler, [*calls, ended(num_calls=2)]).trajectories
    restarted = TrajectoryAssembler()
    restarted.restore_closed("s1", CloseMarker.from_bytes(CloseMarker.of(5_000, trajectory.call_ids).to_bytes()))
    assert feed(restarted, calls) == Emitted()
    assert restarted.stats.redelivered_calls == 2 and restarted.stats.late_calls == 0


def test_close_markers_round_trip_and_old_markers_read_without_digests() -> None:
    marker = CloseMarker.of(123, ("a", "b", "c"))
    assert CloseMarker.from_bytes(marker.to_bytes()) == marker
    assert marker.call_digests == {call_digest("a"), call_digest("b"), call_digest("c")}
    old = CloseMarker.from_bytes((77).to_bytes(8, "little", signed=True))
    assert old == CloseMarker(77, None)
    with pytest.raises(DeltaError, match="close marker of 20 bytes does not hold 3 digests"):
        CloseMarker.from_bytes(marker.to_bytes()[:20])  # truncated: one digest of three
    assembler = TrajectoryAssembler()
    assembler.restore_closed("s1", old)  # an old marker cannot tell: the call is dropped as before
    assert assembler.on_call(two_turns()[0]) == Emitted() and assembler.stats.late_calls == 1


@FAST
@given(sessions(max_turns=9))
def test_calls_recorded_by_reference_give_the_trajectory_of_the_calls_in_full(calls) -> None:
    from schemas.prompt_refs import reference_form

    recorded = [decode_event(encode_event(reference_form(c, calls[:i]))) for i, c in enumerate(calls)]
    full = feed(TrajectoryAssembler(), [started(), *calls, ended(num_calls=len(calls))]).trajectories
    by_ref = feed(TrajectoryAssembler(), [started(), *recorded, ended(num_calls=len(calls))]).trajectories
    assert [encode_event(t) for t in by_ref] == [encode_event(t) for t in full]


def test_a_reference_to_a_call_the_session_does_not_hold_is_rejected_and_changes_nothing() -> None:
    from agents_adapter.errors import UnresolvedCallError
    from schemas.prompt_refs import by_reference

    first, second = two_turns()
    assembler = TrajectoryAssembler()
    with pytest.raises(UnresolvedCallError, match=r"s1-b.*s1-a"):
        assembler.on_call(by_reference(second, first.call_id, 5))
    assert assembler.open_sessions == 0
    assembler.on_call(first)
    with pytest.raises(UnresolvedCallError, match="takes 6 ids"):
        assembler.on_call(by_reference(second, first.call_id, 6))
    assembler.on_call(by_reference(second, first.call_id, 5))
    tree = assembler.tree("s1")
    assert tree is not None and tree.num_calls == 2
