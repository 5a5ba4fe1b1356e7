"""The trainer buffers no held-out evaluation session (schemas.rollout_events.is_held_out): even a held-out
group that completed (its BatchReady fired) is never a step's group, in standalone mode or as a group
dynamic sampling adds, so an evaluation is never trained on."""

from __future__ import annotations

import pytest

from schemas.events import BatchReady
from schemas.rollout_events import HELD_OUT_GROUP_PREFIX
from tests.unit.trainer.trainer_helpers import node, trajectory
from trainer_svc.buffer import Position
from trainer_svc.config import AlgorithmConfig
from trainer_svc.dynamic_sampling import Fill, scheduled_fill, standalone_fill
from trainer_svc.ledger import Ledger

pytestmark = pytest.mark.unit


def add_group(ledger: Ledger, group_id: str, rewards: list[float], offset: int) -> list[str]:
    """A complete group: its members, then its BatchReady; what the ledger answered for each."""
    members = [trajectory([node(0, -1, [1, 2, 3], [0, 1, 1])], trajectory_id=f"{group_id}-{i}", group_id=group_id,
                          reward=r) for i, r in enumerate(rewards)]
    answers = [ledger.add_trajectory(t, Position("traj", 0, offset + i)) for i, t in enumerate(members)]
    ready = BatchReady(correlation_id=group_id, group_id=group_id, task_id=group_id, num_samples=len(members),
                       trajectory_ids=tuple(t.trajectory_id for t in members), min_version=0, max_version=0)
    return [*answers, ledger.add_batch_ready(ready, Position("traj", 0, offset + len(members)))]


def test_a_complete_held_out_group_is_never_buffered_nor_picked() -> None:
    ledger = Ledger(0)
    held_out = f"{HELD_OUT_GROUP_PREFIX}demo/step-0/arith-1007-0"
    assert add_group(ledger, held_out, [0.0, 1.0], 0) == ["held_out"] * 3
    assert add_group(ledger, "train-g", [0.0, 1.0], 10) == ["buffered"] * 3
    assert [g.group_id for g in ledger.complete_groups()] == ["train-g"]
    on = AlgorithmConfig(dynamic_sampling=True, dynamic_sampling_max_filtered=4)
    assert standalone_fill(ledger, 2, AlgorithmConfig()) is None  # one trainable group, not two
    add_group(ledger, "flat", [1.0, 1.0], 20)
    assert scheduled_fill(ledger, ["flat"], on) == Fill(("train-g",), filtered=("flat",), added=("train-g",))
