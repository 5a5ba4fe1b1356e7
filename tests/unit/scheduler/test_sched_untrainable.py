"""Data that cannot be trained never stalls a run: a step the trainer skipped is planned again with
its tasks dispatched anew (within max_regenerations), and a group whose samples never all report is
aborted by the group timeout. Hand-made situations on the core, plus the journal's event mapping."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_svc.decisions import Assignment, TaskAborted, TaskDispatched, TrainData, TrainStepSkipped
from scheduler_svc.errors import ConfigError
from scheduler_svc.journal import JournaledScheduler
from scheduler_svc.policies import colocated
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.settings import SchedulerSettings
from schemas import events as ev
from tests.factories import example
from tests.unit.scheduler.conftest import World, make_tasks

pytestmark = pytest.mark.unit


def _running_step(world: World) -> tuple[Assignment, list[str]]:
    """Completes every dispatched group until a train step holds its final batch."""
    while world.train is None or not world.train_final:
        world.advance(1.0)
        world.complete_group(sorted(world.inflight)[0])
    assert world.train is not None
    return world.train, [g for d in world.fed for g in d.group_ids]


def _skip(world: World, assignment_id: str, step: int) -> list:
    world.advance(1.0)
    decisions = world.observe(TrainStepSkipped(world.t, assignment_id, step, "nothing trainable"))
    if world.train is not None and world.train.assignment_id == assignment_id:
        world.train, world.train_final, world.fed = None, False, []
    return decisions


def test_a_skipped_step_re_dispatches_its_tasks_and_is_planned_again(world_factory) -> None:
    world = world_factory(colocated(max_staleness=1), batch=2, samples=2, inflight_per_resource=4, tasks=6)
    world.register_all(["H800"])
    assignment, groups = _running_step(world)
    decisions = _skip(world, assignment.assignment_id, assignment.step or 0)
    aborted = [d for d in decisions if isinstance(d, TaskAborted)]
    assert [(d.group_id, d.cause, d.regenerate) for d in aborted] == [(g, "untrainable", True) for g in sorted(groups)]
    redispatched = [d.group_id for d in decisions if isinstance(d, TaskDispatched)]
    assert redispatched and redispatched[0] in {f"{g}#r1" for g in groups}  # skipped tasks come back first
    rollout = world.scheduler.rollout
    assert rollout.train is None or rollout.train.assignment_id != assignment.assignment_id
    assert rollout.version == 0 and rollout.steps_skipped == 1 and rollout.steps_completed == 0
    # the step is planned again at the same version and trains on fresh groups
    again, fed = _running_step(world)
    assert again.assignment_id != assignment.assignment_id and again.step == assignment.step
    assert not set(fed) & set(groups)
    world.finish_train()
    assert world.scheduler.version == 1
    dispatched = {d.group_id for d in world.history if isinstance(d, TaskDispatched)}
    assert {f"{g}#r1" for g in groups} <= dispatched


def test_a_task_skipped_past_max_regenerations_is_dropped(world_factory) -> None:
    world = world_factory(colocated(max_staleness=1), batch=1, samples=2, inflight_per_resource=2, tasks=3)
    world.register_all(["H800"])
    policy_limit = world.scheduler.policy.max_regenerations
    first, groups = _running_step(world)
    _skip(world, first.assignment_id, 0)
    retried = f"{groups[0]}#r1"
    while world.train is None or not world.train_final or retried not in {g for d in world.fed for g in d.group_ids}:
        if world.train is not None and world.train_final:
            world.finish_train()
        world.advance(1.0)
        world.complete_group(sorted(world.inflight)[0])
    decisions = _skip(world, world.train.assignment_id, world.scheduler.version)
    final = [d for d in decisions if isinstance(d, TaskAborted) and d.group_id == retried]
    assert policy_limit == 1 and final and final[0].regenerate is False and final[0].attempt == 1
    assert world.scheduler.loader.dropped_total == 1


def test_a_skip_of_another_assignment_changes_nothing(world_factory) -> None:
    world = world_factory(colocated(max_staleness=1), batch=1, samples=1, inflight_per_resource=2, tasks=4)
    world.register_all(["H800"])
    assignment, _ = _running_step(world)
    before = world.scheduler.snapshot()
    decisions = world.scheduler.handle(TrainStepSkipped(world.t, "an-old-assignment", 0))
    assert not [d for d in decisions if isinstance(d, TaskAborted | Assignment)]
    after = world.scheduler.snapshot()
    assert after["rollout"]["train"] == before["rollout"]["train"]
    assert after["loader"]["by_assignment"] == before["loader"]["by_assignment"]
    assert world.scheduler.rollout.train is not None
    assert world.scheduler.rollout.train.assignment_id == assignment.assignment_id


def test_a_group_that_never_completes_is_aborted_by_the_timeout(world_factory) -> None:
    world = world_factory(colocated(max_staleness=4), batch=4, samples=2, inflight_per_resource=4, tasks=10,
                          group_timeout_s=30.0)
    world.register_all(["H800"])
    stuck, done = sorted(world.inflight)[:2]
    world.complete_sample(stuck)  # one member reports, the other's end never arrives
    world.complete_group(done)
    world.advance(29.0)
    assert not [d for d in world.tick() if isinstance(d, TaskAborted)]
    world.advance(1.0)
    decisions = world.tick()
    aborted = {d.group_id: d for d in decisions if isinstance(d, TaskAborted)}
    assert stuck in aborted and done not in aborted
    assert aborted[stuck].cause == "group_timeout" and aborted[stuck].regenerate
    assert f"{stuck}#r1" in {d.group_id for d in decisions if isinstance(d, TaskDispatched)}
    # the re-dispatched group has a timeout of its own, counted from its dispatch
    world.advance(1.0)
    assert f"{stuck}#r1" not in {d.group_id for d in world.tick() if isinstance(d, TaskAborted)}
    rebuilt = Scheduler.from_log(world.scheduler.policy, world.scheduler.settings, world.scheduler.loader.tasks,
                                 list(world.scheduler.log))
    assert rebuilt.snapshot() == world.scheduler.snapshot()


def test_without_a_group_timeout_nothing_is_aborted(world_factory) -> None:
    world = world_factory(colocated(max_staleness=4), batch=4, samples=2, inflight_per_resource=4, tasks=10)
    world.register_all(["H800"])
    world.advance(10_000.0)
    assert not [d for d in world.tick() if isinstance(d, TaskAborted)]


def test_group_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="group_timeout_s"):
        SchedulerSettings(train_batch_groups=1, samples_per_task=1, group_timeout_s=0.0)


def _journaled(**settings: object) -> JournaledScheduler:
    core = Scheduler(colocated(max_staleness=1),
                     SchedulerSettings(train_batch_groups=1, samples_per_task=1, **settings),  # type: ignore[arg-type]
                     make_tasks(4), record_log=False)
    return JournaledScheduler(core, run_id="run-1", producer="scheduler-0")


def test_journal_maps_a_skipped_train_step_event_and_the_group_timeout_tick() -> None:
    js = _journaled(group_timeout_s=30.0, heartbeat_timeout_s=1_000.0)
    registered = dataclasses.replace(example(ev.ResourceRegistered, 1), resource_id="r0", device_kind="H800",
                                     ts_ms=1_000, producer="infer-0")
    js.observe(js.input_of(registered) or {})
    gid = next(iter(js.core.loader.groups))
    trajectory = dataclasses.replace(example(ev.Trajectory, 1), group_id=gid, nodes=(), ts_ms=2_000,
                                     producer="processor")
    step = js.observe(js.input_of(trajectory) or {})  # an empty trajectory still completes its member
    assert step is not None and js.core.rollout.train is not None
    train = js.core.rollout.train
    assert any(isinstance(e, ev.TrainData) for e in step.events)
    skipped = dataclasses.replace(example(ev.TrainStepCompleted, 1), run_id="run-1", ts_ms=3_000,
                                  correlation_id=train.assignment_id, step=train.step, new_version=0,
                                  status="skipped", reason="nothing to train on", producer="trainer")
    facts = js.input_of(skipped)
    assert facts is not None and facts["kind"] == "step_skipped"
    out = js.observe(facts)
    assert out is not None
    completed = [e for e in out.events if isinstance(e, ev.TaskCompleted)]
    assert [(e.group_id, e.status) for e in completed] == [(gid, "aborted")]
    assert js.core.rollout.steps_skipped == 1 and js.core.version == 0
    # a repeat of that skip (a restarted trainer) does not end the step planned in its place
    assert js.observe(js.input_of(dataclasses.replace(skipped, ts_ms=4_000)) or {}) is None
    # the group timeout makes a tick worth journaling
    assert not js.should_tick(4.0)
    assert js.should_tick(3.0 + 30.0)
    tick = js.observe(js.tick_input(3.0 + 30.0))
    assert tick is not None
    statuses = {e.group_id: e.status for e in tick.events if isinstance(e, ev.TaskCompleted)}
    assert statuses[f"{gid}#r1"] == "dropped"  # its second timeout-or-skip: past max_regenerations
    assert set(statuses.values()) <= {"aborted", "dropped"} and len(statuses) >= 2


def test_train_data_of_a_skipped_step_never_reaches_a_later_step(world_factory) -> None:
    world = world_factory(colocated(max_staleness=1), batch=2, samples=1, inflight_per_resource=4, tasks=8)
    world.register_all(["H800"])
    assignment, groups = _running_step(world)
    _skip(world, assignment.assignment_id, 0)
    for _ in range(3):
        _running_step(world)
        world.finish_train()
    fed_later = [g for d in world.history if isinstance(d, TrainData) and d.assignment_id != assignment.assignment_id
                 for g in d.group_ids]
    assert not set(fed_later) & set(groups)
