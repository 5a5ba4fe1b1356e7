"""Held-out evaluation sessions are never trained on, by design: a train step names only groups the
scheduler dispatched, and an evaluation's groups are never dispatched (infra/evaluation.py), so their
samples are ignored however complete they look."""

from __future__ import annotations

import pytest

from scheduler_svc.decisions import SampleCompleted, TrainData
from scheduler_svc.policies import disaggregated
from schemas.rollout_events import HELD_OUT_GROUP_PREFIX

pytestmark = pytest.mark.unit


def test_samples_of_groups_it_never_dispatched_are_in_no_train_step(world_factory) -> None:
    world = world_factory(disaggregated(1), batch=1, samples=2)
    world.register_all(["H800", "H800"])
    held_out = [f"{HELD_OUT_GROUP_PREFIX}demo/step-0/arith-1007-{i}" for i in range(3)]
    ignored_before = world.scheduler.loader.ignored_samples
    for _ in range(3):  # three train steps, held-out samples arriving before each
        for gid in held_out:
            for index in (0, 1):  # a full group's worth, as if it had been dispatched with 2 samples
                world.observe(SampleCompleted(world.t, gid, index, 10, ((world.scheduler.version, 10),)))
        for gid in list(world.inflight):
            world.complete_group(gid)
        assert world.finish_train(), "a train step ran on the dispatched groups"
        world.ack_all_loads()
        world.advance()
    fed = [g for d in world.history if isinstance(d, TrainData) for g in d.group_ids]
    assert len(world.trained_groups) >= 3 and fed
    assert not [g for g in fed + world.trained_groups if g.startswith(HELD_OUT_GROUP_PREFIX)]
    assert world.scheduler.loader.ignored_samples - ignored_before == 3 * len(held_out) * 2
