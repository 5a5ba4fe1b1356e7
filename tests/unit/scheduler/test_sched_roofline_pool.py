"""Roofline priorities and the resource pool: capability queries, SPMD and preemptive assignment,
failures and joins."""

from __future__ import annotations

import pytest

from scheduler_svc.decisions import (
    Assignment,
    Heartbeat,
    PauseRollout,
    Preemption,
    ResourceLost,
    ResourceRegistered,
    TagTransition,
    TrainData,
)
from scheduler_svc.errors import CapabilityError, ConfigError, ReplayError
from scheduler_svc.policies import colocated, spatiotemporal
from scheduler_svc.pool import ResourcePool
from scheduler_svc.roofline import (
    DEVICE_PRESETS,
    DeviceSpec,
    attainable_flops,
    device_preset,
    rank_for_training,
    train_priority,
)

pytestmark = pytest.mark.unit


def test_presets_have_datasheet_magnitudes() -> None:
    h800, h20 = DEVICE_PRESETS["H800"], DEVICE_PRESETS["H20"]
    assert h800.peak_tflops == pytest.approx(989) and h800.hbm_tb_per_s == pytest.approx(3.35)
    assert h20.peak_tflops < h800.peak_tflops / 5 and h20.hbm_tb_per_s > h800.hbm_tb_per_s
    assert DEVICE_PRESETS["H200"].hbm_tb_per_s > h800.hbm_tb_per_s
    assert DEVICE_PRESETS["A100"].peak_tflops == pytest.approx(312)


def test_roofline_orders_a_mixed_pool_sensibly() -> None:
    """Compute-rich parts train, bandwidth-rich parts roll out: H800 > A100 > H20, and H800 > H200
    (same compute, more bandwidth: the H200 is the better decoder)."""
    mix = [("h20-0", device_preset("H20")), ("a100-0", device_preset("A100")), ("h800-0", device_preset("H800"))]
    assert rank_for_training(mix) == ["h800-0", "a100-0", "h20-0"]
    assert train_priority(device_preset("H800")) > train_priority(device_preset("H200"))
    # decoding (low intensity) is bandwidth bound everywhere, so the H20 decodes faster than an A100
    assert attainable_flops(device_preset("H20"), 16) > attainable_flops(device_preset("A100"), 16)
    # training (high intensity) runs at peak compute
    assert attainable_flops(device_preset("H800"), 400) == device_preset("H800").peak_flops


def test_device_spec_rejects_bad_numbers() -> None:
    with pytest.raises(ConfigError, match="peak_tflops"):
        DeviceSpec("bad", 0.0, 1.0, 1.0)
    with pytest.raises(ConfigError, match="unknown device kind"):
        device_preset("TPU9")
    assert device_preset("H800").scaled(4).peak_tflops == pytest.approx(4 * 989)


def _pool(*kinds: str) -> ResourcePool:
    pool = ResourcePool()
    for i, kind in enumerate(kinds):
        pool.apply(ResourceRegistered(0.0, f"r{i}", device_preset(kind)))
    return pool


def _tags(pool: ResourcePool, rid: str, caps: tuple[str, ...]) -> None:
    for d in pool.plan_capabilities(rid, frozenset(caps), "test"):
        pool.apply(d)


def test_capability_queries_and_spmd_assignment() -> None:
    pool = _pool("H800", "H800", "H20")
    _tags(pool, "r0", ("rollout", "train"))
    _tags(pool, "r1", ("rollout", "train"))
    _tags(pool, "r2", ("rollout",))
    assert [r.resource_id for r in pool.with_capability("train")] == ["r0", "r1"]
    assert [r.resource_id for r in pool.with_capability("rollout")] == ["r0", "r1", "r2"]
    decisions = pool.plan_assignment("train", ["r0", "r1"], cause="step", step=0, work=("g1",))
    assert [type(d) for d in decisions] == [TagTransition, TagTransition, Assignment]
    for d in decisions:
        pool.apply(d)
    assert {pool.get(r).activity for r in ("r0", "r1")} == {"train"}
    assert pool.assignment_of("r0") is pool.assignment_of("r1")
    with pytest.raises(CapabilityError, match="lacks capability"):
        pool.plan_assignment("train", ["r2"], cause="step")


def test_preemption_tells_the_task_and_hands_its_work_back() -> None:
    pool = _pool("H800", "H800")
    _tags(pool, "r0", ("rollout", "train"))
    _tags(pool, "r1", ("rollout", "train"))
    for d in pool.plan_assignment("train", ["r0", "r1"], cause="step", work=("g1", "g2")):
        pool.apply(d)
    pool.apply(TrainData("a0", 0, ("g3",), (0,), True))
    decisions = pool.plan_assignment("rollout", ["r0"], cause="urgent")
    preemption = next(d for d in decisions if isinstance(d, Preemption))
    assert preemption.assignment_id == "a0"
    assert preemption.by_assignment_id == "a1"
    assert preemption.handed_back == ("g1", "g2", "g3")
    assert preemption.resource_ids == ("r0", "r1")
    # the member left out of the new assignment falls back to idle
    assert TagTransition("r1", "activity", ("train",), ("idle",), "urgent") in decisions
    for d in decisions:
        pool.apply(d)
    assert "a0" not in pool.assignments
    assert pool.get("r0").activity == "rollout" and pool.get("r1").activity == "idle"


def test_preempting_rollout_aborts_the_engine() -> None:
    pool = _pool("H800")
    _tags(pool, "r0", ("rollout", "train"))
    for d in pool.plan_assignment("rollout", ["r0"], cause="start"):
        pool.apply(d)
    decisions = pool.plan_assignment("train", ["r0"], cause="train_step")
    assert PauseRollout("r0", "abort", "train_step") in decisions


def test_loss_removes_tags_and_hands_back_work() -> None:
    pool = _pool("H800", "H800")
    _tags(pool, "r0", ("rollout", "train"))
    _tags(pool, "r1", ("rollout", "train"))
    for d in pool.plan_assignment("train", ["r0", "r1"], cause="step", work=("g1",)):
        pool.apply(d)
    decisions = pool.plan_loss("r1", "heartbeat_timeout")
    assert isinstance(decisions[0], ResourceLost)
    preemption = next(d for d in decisions if isinstance(d, Preemption))
    assert preemption.handed_back == ("g1",)
    for d in decisions:
        pool.apply(d)
    assert pool.get("r1").capabilities == frozenset() and pool.get("r1").activity == "offline"
    assert pool.get("r0").activity == "idle"
    assert [r.resource_id for r in pool.with_capability("train")] == ["r0"]
    with pytest.raises(CapabilityError, match="offline"):
        pool.plan_assignment("train", ["r1"], cause="step")


def test_heartbeats_and_expiry() -> None:
    pool = _pool("H800", "H20")
    pool.apply(Heartbeat(20.0, "r0"))
    assert pool.expired(31.0, 30.0) == ["r1"]
    pool.apply(Heartbeat(5.0, "r0"))  # late, out-of-order heartbeat does not move time back
    assert pool.get("r0").last_heartbeat == 20.0


def test_apply_rejects_a_transition_that_does_not_fit() -> None:
    pool = _pool("H800")
    with pytest.raises(ReplayError, match="from"):
        pool.apply(TagTransition("r0", "activity", ("train",), ("idle",), "forged"))


def test_scheduler_heartbeat_timeout_reassigns_work_and_never_targets_the_dead(world_factory) -> None:
    world = world_factory(colocated(), batch=2, samples=1, heartbeat_timeout_s=10.0)
    world.register_all(["H800", "H800", "H800"])
    for gid in list(world.inflight):
        world.complete_group(gid)
    assert world.train is not None and set(world.train.resource_ids) == {"r0", "r1", "r2"}
    groups = {g for d in world.fed for g in d.group_ids}
    world.advance(5)
    world.observe(Heartbeat(world.t, "r0"))
    world.observe(Heartbeat(world.t, "r1"))
    world.advance(6)
    decisions = world.tick()  # r2 silent for 11 s
    lost = [d for d in decisions if isinstance(d, ResourceLost)]
    assert [d.resource_id for d in lost] == ["r2"]
    handed = next(d for d in decisions if isinstance(d, Preemption))
    assert set(handed.handed_back) == groups
    reissued = next(d for d in decisions if isinstance(d, Assignment) and d.task_kind == "train")
    assert reissued.resource_ids == ("r0", "r1")
    assert {g for d in decisions if isinstance(d, TrainData) for g in d.group_ids} == groups
    start = len(world.history)
    for _ in range(6):  # several further steps: nothing is ever addressed to r2
        world.finish_train()
        world.ack_all_loads()
        for gid in list(world.inflight):
            world.complete_group(gid)
    later = world.history[start:]
    assert len([d for d in later if isinstance(d, Assignment) and d.task_kind == "train"]) >= 3
    for d in later:
        assert "r2" not in getattr(d, "resource_ids", ()), d
        assert getattr(d, "resource_id", None) != "r2", d


def test_resources_join_at_run_time_and_get_work(world_factory) -> None:
    world = world_factory(spatiotemporal(1), batch=2, samples=2, inflight_per_resource=2)
    world.register("r0")
    before = len(world.inflight)
    decisions = world.register("r1", version=None)  # joins with no weights loaded
    assert any(isinstance(d, TagTransition) and d.resource_id == "r1" for d in decisions)
    load = [d for d in decisions if getattr(d, "resource_id", None) == "r1" and type(d).__name__ == "LoadWeights"]
    assert load, "a joiner without current weights loads them before rolling out"
    decisions = world.ack_load("r1")
    assert any(type(d).__name__ == "ResumeRollout" and d.resource_id == "r1" for d in decisions)
    assert len(world.inflight) > before  # its capacity lets the loader dispatch more


def test_a_recovered_resource_rejoins(world_factory) -> None:
    world = world_factory(colocated(), batch=2, samples=1)
    world.register_all(["H800", "H800"])
    world.kill("r1")
    assert world.scheduler.pool.get("r1").activity == "offline"
    decisions = world.register("r1")
    assert TagTransition("r1", "activity", ("idle",), ("rollout",), "resource_added") in decisions
    assert world.scheduler.pool.get("r1").alive
