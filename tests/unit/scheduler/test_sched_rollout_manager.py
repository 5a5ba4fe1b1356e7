"""Rollout manager: interrupt and resume triggers, the weight-sync sequence, micro-batch streaming,
and the staleness bound under arbitrary completion orders (hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_svc.decisions import (
    Assignment,
    LoadWeights,
    PauseRollout,
    ResumeRollout,
    TaskDispatched,
    TrainData,
    WeightSyncCompleted,
)
from scheduler_svc.policies import colocated, disaggregated, spatiotemporal

pytestmark = pytest.mark.unit


def test_weight_sync_pauses_loads_and_resumes_only_when_every_resource_acknowledged(world_factory) -> None:
    world = world_factory(disaggregated(1), batch=1, samples=1)
    world.register_all(["H800", "H800", "H800", "H800"])
    for gid in list(world.inflight):
        world.complete_group(gid)
    done = world.finish_train()
    rollout = ["r1", "r2", "r3"]
    pauses = [d for d in done if isinstance(d, PauseRollout)]
    loads = [d for d in done if isinstance(d, LoadWeights)]
    assert [(p.resource_id, p.mode) for p in pauses] == [(r, "in_place") for r in rollout]
    assert [(x.resource_id, x.version) for x in loads] == [(r, 1) for r in rollout]
    assert len({x.sync_id for x in loads}) == 1
    # pause comes before load for each resource
    for r in rollout:
        order = [type(d).__name__ for d in done if getattr(d, "resource_id", None) == r]
        assert order.index("PauseRollout") < order.index("LoadWeights")
    assert not any(isinstance(d, ResumeRollout) for d in world.ack_load("r1"))
    assert not any(isinstance(d, ResumeRollout) for d in world.ack_load("r3"))
    last = world.ack_load("r2")
    assert [d.resource_id for d in last if isinstance(d, ResumeRollout)] == rollout
    assert all(d.version == 1 for d in last if isinstance(d, ResumeRollout))
    assert any(isinstance(d, WeightSyncCompleted) for d in last)


def test_a_resource_lost_during_sync_does_not_block_the_others(world_factory) -> None:
    world = world_factory(disaggregated(1), batch=1, samples=1)
    world.register_all(["H800", "H800", "H800"])
    for gid in list(world.inflight):
        world.complete_group(gid)
    world.finish_train()
    world.ack_load("r1")
    decisions = world.kill("r2")
    assert [d.resource_id for d in decisions if isinstance(d, ResumeRollout)] == ["r1"]


def test_sample_threshold_triggers_the_step_only_when_the_batch_is_complete(world_factory) -> None:
    world = world_factory(colocated(), batch=3, samples=2, inflight_per_resource=8)
    world.register_all(["H800"])
    groups = sorted(world.inflight)
    world.complete_group(groups[0])
    world.complete_group(groups[1])
    world.complete_sample(groups[2])
    assert world.train is None
    world.complete_sample(groups[2])
    assert world.train is not None


def test_batch_timeout_trains_on_what_is_ready(world_factory) -> None:
    world = world_factory(
        spatiotemporal(1), batch=4, samples=1, batch_timeout_s=30.0, heartbeat_timeout_s=1e6, inflight_per_resource=2
    )
    world.register_all(["H800", "H800"])
    first = sorted(world.inflight)[0]
    world.complete_group(first)
    world.advance(10)
    world.tick()
    assert world.train is None
    world.advance(25)
    decisions = world.tick()
    fed = [d for d in decisions if isinstance(d, TrainData)]
    assert fed and fed[0].final and fed[0].group_ids == (first,)


def test_microbatches_start_training_early_and_stream_the_rest(world_factory) -> None:
    world = world_factory(disaggregated(1, train_microbatches=2), batch=4, samples=1)
    world.register_all(["H800", "H800", "H800"])
    groups = sorted(world.inflight)
    assert len(groups) == 4
    world.complete_group(groups[0])
    assert world.train is None
    world.complete_group(groups[1])
    assert world.train is not None and len(world.fed) == 1 and not world.fed[0].final
    world.complete_group(groups[2])
    assert len(world.fed) == 1  # waits for a full micro-batch
    world.complete_group(groups[3])
    assert len(world.fed) == 2 and world.fed[1].final
    assert {g for d in world.fed for g in d.group_ids} == set(groups)


def test_train_resources_are_resumed_when_a_step_ends(world_factory) -> None:
    world = world_factory(spatiotemporal(1), batch=1, samples=1)
    world.register_all(["H800", "H800"])
    world.complete_group(sorted(world.inflight)[0])
    assert world.scheduler.pool.get("r0").activity == "train"
    world.finish_train()
    assert world.scheduler.pool.get("r0").activity == "weight_sync"
    resumed = world.ack_load("r0")
    assert ResumeRollout("r0", 1, "weights_loaded") in resumed


POLICIES = [
    colocated(),
    disaggregated(1),
    disaggregated(1, train_microbatches=2),
    disaggregated(1, max_staleness=1, train_microbatches=3),
    spatiotemporal(1),
    spatiotemporal(2, max_staleness=2),
    spatiotemporal(1, max_staleness=0),
]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    policy_index=st.integers(0, len(POLICIES) - 1),
    kinds=st.lists(st.sampled_from(["H800", "H20", "A100"]), min_size=2, max_size=5),
    batch=st.integers(1, 4),
    samples=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
    actions=st.lists(st.integers(0, 19), min_size=20, max_size=250),
)
def test_staleness_bound_is_never_exceeded(world_factory, policy_index, kinds, batch, samples, seed, actions) -> None:
    """Whatever order samples finish in, whatever fails or joins: every group trained on was
    dispatched at most `max_staleness` versions before the step that consumes it, and the loader
    never has more work outstanding than the bound allows."""
    policy = POLICIES[policy_index]
    eta = policy.max_staleness
    world = world_factory(policy, batch=batch, samples=samples, inflight_per_resource=3, tasks=400)
    world.register_all(kinds)
    rng = random.Random(seed)
    joined = 0
    for action in actions:
        world.advance(1.0)
        if action < 12:
            world.complete_random_sample(rng)
        elif action < 15:
            world.finish_train()
        elif action < 18:
            world.ack_load(rng.choice(sorted(world.loads)) if world.loads else None)
        elif action == 18 and len(world.scheduler.pool.alive()) > 1:
            world.kill(rng.choice([r.resource_id for r in world.scheduler.pool.alive()]))
        else:
            world.register(f"j{joined}", rng.choice(["H800", "H20"]), version=None)
            joined += 1
    for d in world.history:
        if isinstance(d, TrainData):
            for v in d.group_versions:
                assert 0 <= d.step - v <= eta, (policy.name, d)
        if isinstance(d, TaskDispatched):
            assert d.policy_version <= world.scheduler.version
    trained = world.trained_groups
    assert len(trained) == len(set(trained)), "a group was trained on twice"
    assert max(world.scheduler.rollout.lag_histogram, default=0) <= eta


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.name}-eta{p.max_staleness}-mb{p.train_microbatches}")
def test_every_policy_makes_progress_to_many_steps(world_factory, policy) -> None:
    world = world_factory(policy, batch=2, samples=2, inflight_per_resource=4)
    world.register_all(["H800", "H800", "H20", "H20"])
    rng = random.Random(7)
    for _ in range(3000):
        if world.scheduler.rollout.steps_completed >= 10:
            break
        world.advance(1.0)
        if not world.finish_train() and not world.ack_load():
            world.complete_random_sample(rng)
    assert world.scheduler.rollout.steps_completed >= 10
    steps = [d.step for d in world.history if isinstance(d, Assignment) and d.task_kind == "train"]
    assert steps == sorted(steps) and steps[:3] == [0, 1, 2]
