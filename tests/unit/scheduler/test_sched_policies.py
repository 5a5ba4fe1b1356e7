"""Tag transitions of each policy, step by step: colocated, disaggregated, spatiotemporal, and
placement by train_priority on a heterogeneous pool."""

from __future__ import annotations

import pytest

from scheduler_svc.decisions import (
    Assignment,
    Decision,
    LoadWeights,
    PauseRollout,
    Preemption,
    ResumeRollout,
    TagTransition,
    TaskDispatched,
    TrainData,
    WeightSyncCompleted,
    WeightSyncStarted,
)
from scheduler_svc.errors import ConfigError
from scheduler_svc.policies import TagGroup, TagPolicy, colocated, disaggregated, spatiotemporal

pytestmark = pytest.mark.unit

RT = ("reference", "rollout", "train")


def activity(decisions: list[Decision]) -> list[tuple[str, str, str]]:
    return [
        (d.resource_id, d.from_tags[0], d.to_tags[0])
        for d in decisions
        if isinstance(d, TagTransition) and d.tag_kind == "activity"
    ]


def capability(decisions: list[Decision]) -> dict[str, tuple[str, ...]]:
    return {d.resource_id: d.to_tags for d in decisions if isinstance(d, TagTransition) and d.tag_kind == "capability"}


def of_type(decisions: list[Decision], kind: type) -> list:
    return [d for d in decisions if isinstance(d, kind)]


def test_colocated_alternates_all_resources_between_rollout_and_train(world_factory) -> None:
    world = world_factory(colocated(), batch=2, samples=2, inflight_per_resource=4)
    d0 = world.register("r0")
    assert capability(d0) == {"r0": RT}
    assert activity(d0) == [("r0", "idle", "rollout")]
    d1 = world.register("r1")
    assert activity(d1) == [("r1", "idle", "rollout")]
    # on-policy: exactly B groups dispatched under version 0, no more
    assert len(world.inflight) == 2
    groups = sorted(world.inflight)
    assert activity(world.complete_group(groups[0])) == []  # threshold not reached
    step = world.complete_group(groups[1])
    # threshold: every resource is preempted from rollout and trains (SPMD)
    assert activity(step) == [("r0", "rollout", "train"), ("r1", "rollout", "train")]
    assert of_type(step, PauseRollout) == [
        PauseRollout("r0", "abort", "train_step"),
        PauseRollout("r1", "abort", "train_step"),
    ]
    train = of_type(step, Assignment)[0]
    assert train.task_kind == "train" and train.resource_ids == ("r0", "r1") and train.step == 0
    assert of_type(step, TrainData)[0].final and set(of_type(step, TrainData)[0].group_ids) == set(groups)
    assert not of_type(step, TaskDispatched)  # nothing is rolled out while training
    done = world.finish_train()
    # back to rollout through a weight load (colocated engines reshard the new weights)
    assert activity(done) == [("r0", "train", "weight_sync"), ("r1", "train", "weight_sync")]
    assert {(d.resource_id, d.version) for d in of_type(done, LoadWeights)} == {("r0", 1), ("r1", 1)}
    assert len(of_type(done, TaskDispatched)) == 2  # next batch, version 1
    assert {d.policy_version for d in of_type(done, TaskDispatched)} == {1}
    back = world.ack_all_loads()
    assert sorted(activity(back)) == [("r0", "weight_sync", "rollout"), ("r1", "weight_sync", "rollout")]
    assert {d.resource_id for d in of_type(back, ResumeRollout)} == {"r0", "r1"}


def test_disaggregated_keeps_roles_fixed(world_factory) -> None:
    world = world_factory(disaggregated(1), batch=2, samples=1)
    world.register_all(["H800", "H800", "H800"])
    caps = {rid: r.capabilities for rid, r in world.scheduler.pool.resources.items()}
    assert caps["r0"] == frozenset({"train", "reference"})
    assert caps["r1"] == caps["r2"] == frozenset({"rollout"})
    assert world.scheduler.pool.get("r0").activity == "idle"
    for gid in list(world.inflight):
        step = world.complete_group(gid)
    assert activity(step) == [("r0", "idle", "train")]
    assert not of_type(step, Preemption)  # nobody is preempted: the trainer was idle
    done = world.finish_train()
    # the trainer goes idle; rollout resources pause in place and load the new version together
    assert ("r0", "train", "idle") in activity(done)
    started = of_type(done, WeightSyncStarted)
    assert started == [WeightSyncStarted(started[0].sync_id, 1, ("r1", "r2"))]
    assert of_type(done, PauseRollout) == [
        PauseRollout("r1", "in_place", "weight_sync"),
        PauseRollout("r2", "in_place", "weight_sync"),
    ]


def test_spatiotemporal_preempts_only_train_tagged_resources(world_factory) -> None:
    world = world_factory(spatiotemporal(2), batch=2, samples=2, inflight_per_resource=4)
    world.register_all(["H800", "H800", "H800", "H800"])
    pool = world.scheduler.pool
    assert [r for r in pool.resources if "train" in pool.get(r).capabilities] == ["r0", "r1"]
    assert {pool.get(r).activity for r in pool.resources} == {"rollout"}  # all roll out first
    assert len(world.inflight) == 4  # one-step async: budget of (1 + 1) x B groups
    first = sorted(world.inflight)[:2]
    world.complete_group(first[0])
    step = world.complete_group(first[1])
    assert activity(step) == [("r0", "rollout", "train"), ("r1", "rollout", "train")]
    assert {p.assignment_id for p in of_type(step, Preemption)} == {"a0", "a1"}
    assert pool.get("r2").activity == pool.get("r3").activity == "rollout"  # never interrupted
    done = world.finish_train()
    # rollout-only resources pause in place and load; the trainers load and come back to rollout
    assert ("r2", "rollout", "weight_sync") in activity(done)
    assert ("r0", "train", "weight_sync") in activity(done)
    world.ack_load("r2")
    partial = world.ack_load("r0")
    assert of_type(partial, ResumeRollout) == [ResumeRollout("r0", 1, "weights_loaded")]
    # r2 and r3 form one sync group: r2 waits for r3
    assert pool.get("r2").activity == "weight_sync"
    rest = world.ack_all_loads()
    assert {d.resource_id for d in of_type(rest, ResumeRollout)} == {"r1", "r2", "r3"}
    assert any(isinstance(d, WeightSyncCompleted) and set(d.resource_ids) == {"r2", "r3"} for d in rest)
    assert {pool.get(r).activity for r in pool.resources} == {"rollout"}


def test_placement_by_train_priority_on_a_heterogeneous_pool(world_factory) -> None:
    world = world_factory(spatiotemporal(2), batch=2, samples=1)
    for rid, kind in [("h20-a", "H20"), ("h20-b", "H20"), ("a100", "A100"), ("h800", "H800")]:
        world.register(rid, kind)
    pool = world.scheduler.pool
    assert {r for r in pool.resources if "train" in pool.get(r).capabilities} == {"h800", "a100"}
    assert pool.get("h20-a").capabilities == frozenset({"rollout"})


def test_placement_is_sticky_and_by_registration_when_asked(world_factory) -> None:
    policy = spatiotemporal(1, placement="registration_order")
    world = world_factory(policy, batch=2, samples=1)
    world.register("slow", "H20")
    world.register("fast", "H800")
    pool = world.scheduler.pool
    assert "train" in pool.get("slow").capabilities and "train" not in pool.get("fast").capabilities


def test_policy_is_validated() -> None:
    with pytest.raises(ConfigError, match="max_staleness"):
        TagPolicy("x", (TagGroup(frozenset({"rollout", "train"})),), max_staleness=-1)
    with pytest.raises(ConfigError, match="'train' tag"):
        TagPolicy("x", (TagGroup(frozenset({"rollout"})),))
    with pytest.raises(ConfigError, match="unknown capability"):
        TagGroup(frozenset({"rollout", "flying"}))
    with pytest.raises(ConfigError, match="placement"):
        spatiotemporal(1, placement="random")


def test_losing_the_rollout_tag_interrupts_rollout(world_factory) -> None:
    """Tag-transition interrupt: when the only trainer dies, disaggregated placement promotes a
    rollout resource to {train, reference}; its rollout is aborted (partial outputs migrate)."""
    world = world_factory(disaggregated(1), batch=2, samples=1)
    world.register_all(["H800", "H20", "H20"])
    assert world.scheduler.pool.get("r1").activity == "rollout"
    decisions = world.kill("r0")
    assert capability(decisions) == {"r0": (), "r1": ("reference", "train")}
    assert PauseRollout("r1", "abort", "capability_change") in decisions
    assert any(isinstance(d, Preemption) and d.resource_ids == ("r1",) for d in decisions)
    assert ("r1", "rollout", "idle") in activity(decisions)
    for gid in list(world.inflight):
        world.complete_group(gid)
    assert world.train is not None and world.train.resource_ids == ("r1",)
