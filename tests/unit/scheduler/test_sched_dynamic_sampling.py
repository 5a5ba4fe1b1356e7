"""Dynamic sampling in scheduled mode: the trainer filters zero-variance groups out of a step, and the
scheduler refills from the stream: later steps take (and rollout generates) as many more groups as
the recent steps' filtered share calls for, within `dynamic_sampling_extra_groups` and the staleness
budget; groups the trainer added beyond an assignment are consumed, never handed to another step."""

from __future__ import annotations

import pytest

from scheduler_svc.decisions import TaskDispatched, TrainData, TrainStepCompleted
from scheduler_svc.policies import disaggregated
from scheduler_svc.scheduler import Scheduler

pytestmark = pytest.mark.unit

B = 4


def run_steps(world, filtered_per_step: list[int]) -> list[int]:
    """Completes every dispatched group, then each step with the given number of groups filtered by
    the trainer; returns the groups fed to each step."""
    sizes = []
    for filtered in filtered_per_step:
        for gid in list(world.inflight):
            world.complete_group(gid)
        assert world.train is not None and world.train_final, "the step closed its batch"
        a, fed = world.train, [g for d in world.fed for g in d.group_ids]
        sizes.append(len(fed))
        world.train, world.train_final, world.fed = None, False, []
        world.trained_groups.extend(fed)
        world.observe(TrainStepCompleted(world.t, a.assignment_id, a.step or 0, (a.step or 0) + 1, filtered))
        world.ack_all_loads()
        world.advance()
    return sizes


def test_steps_grow_by_the_filtered_share_within_the_extra_allowed(world_factory) -> None:
    world = world_factory(disaggregated(1), batch=B, samples=2, inflight_per_resource=64,
                          dynamic_sampling_extra_groups=4)
    world.register_all(["H800", "H800"])
    # half of each step filtered: the next steps take B / (1 - 1/2) = 8 groups; none filtered: back to B
    sizes = run_steps(world, [2, 4, 4, 0, 0, 0, 0])
    assert sizes[0] == B
    assert sizes[2] == 2 * B and sizes[3] == 2 * B
    assert sizes[-1] == B
    world_nearly_all = world_factory(disaggregated(1), batch=B, samples=2, inflight_per_resource=64,
                                     dynamic_sampling_extra_groups=3)
    world_nearly_all.register_all(["H800", "H800"])
    assert run_steps(world_nearly_all, [4, 4, 4, 4])[1:] == [B + 3] * 3  # capped at B + extra


def test_off_every_step_takes_b_whatever_the_trainer_filtered(world_factory) -> None:
    world = world_factory(disaggregated(1), batch=B, samples=2, inflight_per_resource=64)
    world.register_all(["H800", "H800"])
    assert run_steps(world, [3, 3, 3, 3]) == [B] * 4


def test_rollout_is_dispatched_for_the_larger_steps(world_factory) -> None:
    dispatched = []
    for extra in (4, 0):
        world = world_factory(disaggregated(1, max_staleness=1), batch=B, samples=2, inflight_per_resource=64,
                              dynamic_sampling_extra_groups=extra)
        world.register_all(["H800", "H800"])
        run_steps(world, [2, 4, 4])  # half of each step filtered
        dispatched.append(sum(isinstance(d, TaskDispatched) for d in world.history))
    with_refill, without = dispatched
    assert with_refill - without >= 2 * B  # two later steps of 2B groups, dispatched ahead within staleness 1


def test_groups_the_trainer_added_are_consumed_and_the_log_replays(world_factory) -> None:
    world = world_factory(disaggregated(1, max_staleness=1), batch=B, samples=2, inflight_per_resource=64,
                          dynamic_sampling_extra_groups=4)
    world.register_all(["H800", "H800"])
    run_steps(world, [0])
    for gid in list(world.inflight):
        world.complete_group(gid)
    a = world.train
    assert a is not None and world.train_final
    fed = {g for d in world.fed for g in d.group_ids}
    spare = sorted(world.scheduler.loader.ready)  # complete, handed to no step yet
    assert spare, "rollout ran ahead of the step"
    world.train, world.train_final, world.fed = None, False, []
    world.observe(TrainStepCompleted(world.t, a.assignment_id, a.step or 0, (a.step or 0) + 1, 1, (spare[0],)))
    world.ack_all_loads()
    assert spare[0] in world.scheduler.loader.consumed and spare[0] not in world.scheduler.loader.ready
    for gid in list(world.inflight):
        world.complete_group(gid)
    later = {g for d in world.history if isinstance(d, TrainData) for g in d.group_ids} - fed
    assert spare[0] not in later
    replayed = Scheduler.from_log(world.scheduler.policy, world.scheduler.settings,
                                  world.scheduler.loader.tasks, world.scheduler.log)
    assert replayed.snapshot() == world.scheduler.snapshot()
    assert any(isinstance(d, TaskDispatched) for d in world.history)
