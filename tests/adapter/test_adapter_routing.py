"""The routing table: rollout-active resources from events, sticky and least-loaded picks."""

from __future__ import annotations

import pytest

from agents_adapter.proxy.routing import RoutingTable
from schemas import events as ev

pytestmark = pytest.mark.unit


def registered(rid: str, caps: tuple[str, ...] = ("rollout",)) -> ev.ResourceRegistered:
    return ev.ResourceRegistered(resource_id=rid, endpoint=f"http://{rid}:1/", device_kind="cpu", memory_bytes=1,
                                 hbm_bandwidth=1.0, peak_flops=1.0, capabilities=caps)


def activity(rid: str, old: str, new: str) -> ev.TagTransition:
    return ev.TagTransition(resource_id=rid, tag_kind=ev.TagKind.ACTIVITY, from_tags=(old,), to_tags=(new,),
                            cause="test")


def table_with(*rids: str, clock: list[float] | None = None) -> RoutingTable:
    now = clock if clock is not None else [0.0]
    table = RoutingTable(unreachable_cooldown_s=5.0, clock=lambda: now[0])
    for rid in rids:
        table.apply(registered(rid))
        table.apply(activity(rid, "idle", "rollout"))
    return table


def test_event_fed_resource_lifecycle() -> None:
    table = RoutingTable()
    table.apply(registered("r1"))
    assert table.usable_ids() == []  # registered resources start idle, as in the scheduler's pool
    table.apply(activity("r1", "idle", "rollout"))
    assert table.usable_ids() == ["r1"]
    table.apply(ev.PauseRollout(resource_id="r1", mode=ev.PauseMode.IN_PLACE, reason="weight_sync"))
    assert table.usable_ids() == [] and "paused (in_place)" in table.describe_unavailable()
    epoch = table.epoch_of("r1")
    table.apply(ev.ResumeRollout(resource_id="r1", reason="synced"))
    assert table.usable_ids() == ["r1"] and table.epoch_of("r1") == epoch + 1
    table.apply(ev.Preemption(resource_id="r1", preempted_task="rollout", by_task="train", assignment_id="a",
                              reason="train step"))
    assert table.usable_ids() == []
    table.apply(activity("r1", "rollout", "train"))
    table.apply(activity("r1", "train", "rollout"))
    assert table.usable_ids() == ["r1"]
    table.apply(ev.TagTransition(resource_id="r1", tag_kind=ev.TagKind.CAPABILITY, from_tags=("rollout",),
                                 to_tags=("train",), cause="placement"))
    assert table.usable_ids() == [] and "no rollout capability" in table.describe_unavailable()
    table.apply(registered("r1"))
    table.apply(ev.ResourceLost(resource_id="r1", reason="heartbeat timeout"))
    assert table.usable_ids() == [] and "lost" in table.describe_unavailable()
    assert not table.apply(ev.Heartbeat(resource_id="r1", activity="rollout", weight_version=0, running_requests=0,
                                        queued_requests=0, tokens_generated=0))


def test_control_events_for_a_resource_not_yet_registered_are_kept() -> None:
    table = RoutingTable()
    table.apply(ev.PauseRollout(resource_id="r9", mode=ev.PauseMode.ABORT, reason="preempt"))
    table.apply(registered("r9"))
    table.apply(activity("r9", "idle", "rollout"))
    assert table.usable_ids() == []  # still paused until ResumeRollout
    assert "no endpoint" not in table.describe_unavailable()


def test_static_endpoints_are_usable_until_events_say_otherwise() -> None:
    table = RoutingTable()
    table.add_static("s0", "http://127.0.0.1:1")
    assert table.usable_ids() == ["s0"]
    table.apply(ev.PauseRollout(resource_id="s0", mode=ev.PauseMode.IN_PLACE, reason="sync"))
    assert table.usable_ids() == []
    table.apply(ev.ResumeRollout(resource_id="s0", reason="sync"))
    assert table.usable_ids() == ["s0"]
    assert "no rollout resource is known" in RoutingTable().describe_unavailable()


def test_sticky_sessions_and_least_loaded_choice() -> None:
    table = table_with("r1", "r2")
    a = table.acquire("sess-a")
    b = table.acquire("sess-b")
    assert a is not None and b is not None and {a.resource_id, b.resource_id} == {"r1", "r2"}
    again = table.acquire("sess-a")  # sticky although its resource is now the busier one
    assert again is not None and again.resource_id == a.resource_id
    for lease in (a, b, again):
        table.release(lease)
    assert [r["inflight"] for r in table.snapshot()] == [0, 0]
    table.apply(ev.PauseRollout(resource_id=a.resource_id, mode=ev.PauseMode.ABORT, reason="preempt"))
    moved = table.acquire("sess-a")
    assert moved is not None and moved.resource_id == b.resource_id  # not usable: the session moves


def test_unreachable_cooldown_and_avoided_epochs() -> None:
    clock = [100.0]
    table = table_with("r1", "r2", clock=clock)
    table.mark_unreachable("r1")
    assert table.usable_ids() == ["r2"]
    clock[0] += 5.1
    assert table.usable_ids() == ["r1", "r2"]
    avoid = {"r2": table.epoch_of("r2")}
    lease = table.acquire("s", avoid)
    assert lease is not None and lease.resource_id == "r1"
    table.mark_unreachable("r1")
    assert table.acquire("s", avoid) is None  # only the avoided resource is left...
    fallback = table.acquire("s", avoid, allow_avoided=True)  # ...which a waiting call may go back to
    assert fallback is not None and fallback.resource_id == "r2"
    table.apply(ev.ResumeRollout(resource_id="r2", reason="back"))  # a new epoch: no longer avoided
    lease = table.acquire("s", avoid)
    assert lease is not None and lease.resource_id == "r2"


def test_listeners_hear_every_change() -> None:
    table = RoutingTable()
    heard: list[int] = []
    table.subscribe(lambda: heard.append(1))
    table.add_static("s0", "http://x:1")
    table.apply(registered("r1"))
    table.mark_unreachable("s0")
    assert len(heard) == 3
