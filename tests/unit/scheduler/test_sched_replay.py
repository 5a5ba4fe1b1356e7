"""Event sourcing: a scheduler rebuilt from its recorded log equals the original and keeps deciding
exactly as the original would."""

from __future__ import annotations

import random

import pytest

from scheduler_svc.decisions import Heartbeat, SampleCompleted, TagTransition, TaskDispatched, Tick
from scheduler_svc.errors import ReplayError, SchedulerError
from scheduler_svc.policies import colocated, disaggregated, spatiotemporal
from scheduler_svc.scheduler import Scheduler

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "policy",
    [colocated(), disaggregated(1, train_microbatches=2), spatiotemporal(2), spatiotemporal(2, straggler="abort")],
    ids=lambda p: f"{p.name}-mb{p.train_microbatches}-{p.straggler}",
)
def test_rebuilt_scheduler_equals_the_original_at_every_point(world_factory, policy) -> None:
    world = world_factory(policy, batch=2, samples=2, inflight_per_resource=4, heartbeat_timeout_s=50.0)
    world.register_all(["H800", "H20", "A100", "H800"])
    rng = random.Random(3)
    checkpoints = 0
    for i in range(400):
        world.advance(1.0)
        r = rng.random()
        if r < 0.6:
            world.complete_random_sample(rng)
        elif r < 0.75:
            world.finish_train()
        elif r < 0.9:
            world.ack_load()
        elif r < 0.95:
            for res in world.scheduler.pool.alive():
                if res.resource_id != "r3":  # r3 goes silent and times out
                    world.observe(Heartbeat(world.t, res.resource_id))
            world.tick()
        elif i == 200:
            world.register("late", "H200", version=None)
        if i % 50 == 0:
            s = world.scheduler
            rebuilt = Scheduler.from_log(s.policy, s.settings, s.loader.tasks, list(s.log))
            assert rebuilt.snapshot() == s.snapshot()
            checkpoints += 1
    s = world.scheduler
    assert s.rollout.steps_completed >= 3 and not s.pool.get("r3").alive
    rebuilt = Scheduler.from_log(s.policy, s.settings, s.loader.tasks, list(s.log))
    assert rebuilt.snapshot() == s.snapshot()
    # the rebuilt scheduler decides exactly like the original on the same next observations
    gid = next(iter(world.inflight), None)
    nxt = [SampleCompleted(world.t + 1, gid, min(world.inflight[gid]), 5)] if gid else []
    nxt.append(Tick(world.t + 2))
    for obs in nxt:
        assert rebuilt.handle(obs) == s.handle(obs)
    assert rebuilt.snapshot() == s.snapshot()
    assert checkpoints == 8


def test_a_foreign_or_reordered_log_is_rejected(world_factory) -> None:
    world = world_factory(colocated(), batch=2, samples=1)
    world.register_all(["H800", "H800"])
    log = list(world.scheduler.log)
    first_tag = next(i for i, r in enumerate(log) if isinstance(r, TagTransition))
    reordered = log[first_tag:] + log[:first_tag]
    with pytest.raises(SchedulerError):
        Scheduler.from_log(colocated(), world.scheduler.settings, world.scheduler.loader.tasks, reordered)
    s = Scheduler.from_log(colocated(), world.scheduler.settings, world.scheduler.loader.tasks, log)
    dispatch = next(r for r in log if isinstance(r, TaskDispatched))
    with pytest.raises(ReplayError, match="dispatched twice"):
        s.apply(dispatch)


def test_handle_refuses_decisions(world_factory) -> None:
    world = world_factory(colocated())
    with pytest.raises(SchedulerError, match="observation"):
        world.scheduler.handle(TagTransition("r0", "activity", ("idle",), ("rollout",), "x"))  # type: ignore[arg-type]
