"""Rollout manager: interrupt and resume triggers, the weight-sync sequence, micro-batch streaming,
per-token versions under partial rollout, the two ways to keep stragglers within the bound (wait,
abort), and the staleness bound on every trained token under arbitrary completion orders
(hypothesis)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_svc.decisions import (
    Assignment,
    LoadWeights,
    PauseRollout,
    ResumeRollout,
    TaskAborted,
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
    spatiotemporal(1, straggler="abort"),
    spatiotemporal(2, max_staleness=2, straggler="abort"),
    disaggregated(1, max_staleness=1, train_microbatches=2, straggler="abort"),
    colocated(straggler="abort"),
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
    """Whatever order samples finish in, whatever versions their tokens span (partial rollout),
    whatever fails or joins: every token trained on was generated at most `max_staleness` versions
    before the step that consumes it, no group is trained twice or after it was aborted, and the
    core's token-lag accounting matches what the samples reported."""
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
    aborted = {a.group_id for a in world.aborted}
    for d in world.history:
        if isinstance(d, TrainData):
            expected: Counter[int] = Counter()
            for gid, v in zip(d.group_ids, d.group_versions, strict=True):
                assert 0 <= d.step - v <= eta, (policy.name, d)
                assert gid not in aborted
                tokens = world.reported[gid]
                assert v == min((tv for tv, n in tokens.items() if n), default=v), "the oldest token's version"
                for tv, n in tokens.items():
                    if not n:
                        continue  # a sample that generated nothing at a version holds no token of it
                    assert 0 <= d.step - tv <= eta, (policy.name, d, gid, tv)
                    expected[d.step - tv] += n
            assert dict(d.token_lags) == {lag: n for lag, n in expected.items() if n}
        if isinstance(d, TaskDispatched):
            assert d.policy_version <= world.scheduler.version
    trained = world.trained_groups
    assert len(trained) == len(set(trained)), "a group was trained on twice"
    assert max(world.scheduler.rollout.lag_histogram, default=0) <= eta
    assert max(world.scheduler.rollout.token_lag_histogram, default=0) <= eta
    if policy.straggler == "wait":
        assert not aborted


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


def _one_step_async_at_version_1(world_factory, **policy_kwargs):
    """B = 1, n = 1, two H800s, eta = 1. Step 0 trains t0; t1 (dispatched under version 0) is still
    rolling out when version 1 is published, and t2 is dispatched under version 1."""
    world = world_factory(spatiotemporal(1, **policy_kwargs), batch=1, samples=1)
    world.register_all(["H800", "H800"])
    assert sorted(world.inflight) == ["t0@0", "t1@0"]  # budget (eta + 1) x B
    world.complete_group("t0@0")
    assert world.train is not None
    world.finish_train()
    world.ack_all_loads()
    assert world.scheduler.version == 1 and sorted(world.inflight) == ["t1@0", "t2@0"]
    assert world.dispatched_at["t2@0"] == 1
    return world


def test_a_sample_spanning_a_weight_sync_keeps_its_tokens_versions(world_factory) -> None:
    """Partial rollout: t1 was paused at the sync and continued with version 1 weights; its tokens
    carry both versions, the trained-token lags are 1 (old part) and 0 (new part), and the group's
    staleness is that of its oldest token."""
    world = _one_step_async_at_version_1(world_factory)
    world.complete_sample("t1@0", 0, versions=[(0, 30), (1, 70)])
    (fed,) = [d for d in world.history if isinstance(d, TrainData) and d.step == 1]
    assert fed.group_ids == ("t1@0",) and fed.group_versions == (0,)
    assert fed.token_lags == ((0, 70), (1, 30))
    world.finish_train()
    rollout = world.scheduler.rollout
    assert rollout.token_lag_histogram == Counter({0: 10 + 70, 1: 30})  # step 0 trained t0's 10 tokens
    assert rollout.lag_histogram == Counter({0: 1, 1: 1})  # t0; t1 by its largest token lag


def test_a_group_is_as_stale_as_its_oldest_token_not_its_dispatch(world_factory) -> None:
    """t1 was dispatched under version 0 but waited in a queue until after the sync: every token is
    version 1, so it trains at lag 0."""
    world = _one_step_async_at_version_1(world_factory)
    world.complete_sample("t1@0", 0, versions=[(1, 40)])
    (fed,) = [d for d in world.history if isinstance(d, TrainData) and d.step == 1]
    assert fed.group_versions == (1,) and fed.token_lags == ((0, 40),)


def test_wait_holds_the_batch_open_for_a_straggler(world_factory) -> None:
    world = _one_step_async_at_version_1(world_factory)
    world.complete_group("t2@0")
    assert world.train is None  # t2 is ready, but t1 holds version-0 tokens: step 1 is its last chance
    world.complete_group("t1@0")
    assert world.train is not None and world.fed[0].group_ids == ("t1@0",)


def test_abort_closes_on_complete_groups_and_regenerates_then_drops_the_straggler(world_factory) -> None:
    world = _one_step_async_at_version_1(world_factory, straggler="abort")
    decisions = world.complete_group("t2@0")
    assert world.train is not None and world.fed[0].group_ids == ("t2@0",) and world.fed[0].final
    (aborted,) = [d for d in decisions if isinstance(d, TaskAborted)]
    assert (aborted.group_id, aborted.regenerate, aborted.attempt) == ("t1@0", True, 0)
    (again,) = [d for d in decisions if isinstance(d, TaskDispatched)]
    # re-generated at once (the abort freed its budget), under the current version, same prompt
    assert (again.group_id, again.task_id, again.attempt, again.policy_version) == ("t1@0#r1", "t1", 1, 1)
    assert "t1@0" not in world.inflight
    world.finish_train()
    world.ack_all_loads()
    # version 2: t1@0#r1 (version-1 tokens) must be in step 2; it straggles again and is dropped
    fresh = [g for g in world.inflight if g != "t1@0#r1"]
    decisions = world.complete_group(fresh[0])
    (dropped,) = [d for d in decisions if isinstance(d, TaskAborted)]
    assert (dropped.group_id, dropped.regenerate, dropped.attempt) == ("t1@0#r1", False, 1)
    loader = world.scheduler.loader
    assert loader.dropped_total == 1 and not loader.regenerate
    assert not any(isinstance(d, TaskDispatched) and d.task_id == "t1" for d in decisions)


def test_abort_policy_needs_a_strict_bound() -> None:
    from scheduler_svc.errors import ConfigError
    from scheduler_svc.policies import TagPolicy

    with pytest.raises(ConfigError, match="straggler"):
        spatiotemporal(1, straggler="maybe")
    with pytest.raises(ConfigError, match="strict_staleness"):
        TagPolicy("x", spatiotemporal(1).groups, max_staleness=1, strict_staleness=False, straggler="abort")
