"""Dynamic sampling (DAPO) on hand-made groups: zero-variance groups are filtered, not counted as a
step's groups, and replaced from the stream within the configured bound; the step report counts them."""

from __future__ import annotations

import pytest

from schemas.events import BatchReady, Trajectory
from tests.unit.trainer.trainer_helpers import node, trajectory
from trainer_svc.buffer import PendingStep, Position
from trainer_svc.config import AlgorithmConfig
from trainer_svc.dynamic_sampling import Fill, scheduled_fill, standalone_fill
from trainer_svc.ledger import Ledger
from trainer_svc.step_events import StepOrigin, completed_event
from trainer_svc.step_result import StepResult

pytestmark = pytest.mark.unit

ON = AlgorithmConfig(dynamic_sampling=True, dynamic_sampling_max_filtered=3)
OFF = AlgorithmConfig()
_offset = iter(range(10_000))


def add_group(ledger: Ledger, group_id: str, rewards: list[float], *, status: str = "completed") -> None:
    """A complete group (its members, then its BatchReady) with the given member rewards."""
    members: list[Trajectory] = [
        trajectory([node(0, -1, [1, 2, 3], [0, 1, 1])], trajectory_id=f"{group_id}-{i}", group_id=group_id,
                   reward=r, status=status)
        for i, r in enumerate(rewards)
    ]
    for t in members:
        ledger.add_trajectory(t, Position("traj", 0, next(_offset)))
    ledger.add_batch_ready(BatchReady(correlation_id=group_id, group_id=group_id, task_id=group_id,
                                      trajectory_ids=tuple(t.trajectory_id for t in members),
                                      num_samples=len(members), min_version=0, max_version=0),
                           Position("traj", 0, next(_offset)))


def test_off_takes_the_oldest_groups_whatever_their_rewards() -> None:
    ledger = Ledger(0)
    add_group(ledger, "flat", [0.0, 0.0])
    assert standalone_fill(ledger, 2, OFF) is None
    add_group(ledger, "mixed", [0.0, 1.0])
    assert standalone_fill(ledger, 2, OFF) == Fill(("flat", "mixed"))
    assert scheduled_fill(ledger, ["flat"], OFF) == Fill(("flat",))


def test_standalone_passes_over_zero_variance_groups_and_waits_for_groups_with_variance() -> None:
    ledger = Ledger(0)
    add_group(ledger, "a-flat", [1.0, 1.0, 1.0])
    add_group(ledger, "b-mixed", [0.0, 1.0, 1.0])
    add_group(ledger, "c-flat", [0.0, 0.0, 0.0])
    assert standalone_fill(ledger, 2, ON) is None  # one group with variance: the step waits for another
    add_group(ledger, "d-mixed", [0.5, 0.0, 0.0])
    assert standalone_fill(ledger, 2, ON) == Fill(("b-mixed", "d-mixed"), filtered=("a-flat", "c-flat"))


def test_standalone_stops_refilling_at_the_bound() -> None:
    ledger = Ledger(0)
    for name in ("a", "b"):
        add_group(ledger, name, [0.0, 0.0])
    add_group(ledger, "mixed", [0.0, 1.0])
    assert standalone_fill(ledger, 4, ON) is None  # 2 filtered < bound 3: keep waiting
    add_group(ledger, "c", [1.0, 1.0])
    assert standalone_fill(ledger, 4, ON) == Fill(("mixed",), filtered=("a", "b", "c"))
    only_flat = Ledger(0)
    for name in ("x", "y", "z"):
        add_group(only_flat, name, [0.0, 0.0])
    assert standalone_fill(only_flat, 1, ON) == Fill((), filtered=("x", "y", "z"))  # reported as skipped


def test_a_group_without_usable_members_is_not_a_zero_variance_group() -> None:
    ledger = Ledger(0)
    add_group(ledger, "aborted", [0.0, 0.0], status="aborted")
    assert standalone_fill(ledger, 1, ON) == Fill(("aborted",))  # the core drops and reports it


def test_scheduled_replaces_filtered_groups_with_unassigned_complete_ones() -> None:
    ledger = Ledger(0)
    add_group(ledger, "g1", [0.0, 1.0])
    add_group(ledger, "g2", [0.0, 0.0])
    add_group(ledger, "g3", [1.0, 1.0])
    add_group(ledger, "spare-flat", [1.0, 1.0])
    add_group(ledger, "later", [0.0, 1.0])  # named by another pending assignment: not taken
    add_group(ledger, "spare", [1.0, 0.0])
    ledger.pending["a2"] = PendingStep("a2", group_ids=["later"])
    fill = scheduled_fill(ledger, ["g1", "g2", "g3", "missing"], ON)
    assert fill == Fill(("g1", "missing", "spare"), filtered=("g2", "g3"), added=("spare",))


def test_scheduled_keeps_its_groups_when_filtering_would_leave_nothing() -> None:
    ledger = Ledger(0)
    add_group(ledger, "g1", [0.0, 0.0])
    add_group(ledger, "g2", [1.0, 1.0])
    assert scheduled_fill(ledger, ["g1", "g2"], ON) == Fill(("g1", "g2"))


def test_the_step_report_counts_filtered_groups_as_zero_variance() -> None:
    result = StepResult(
        step=3, policy_version=2, new_version=3, loss=0.5, policy_loss=0.5, kl_loss=0.0, value_loss=0.0,
        reward_mean=0.25, kl=0.01, kl_behaviour=0.01, clip_fraction=0.1, iw_mean=1.0, iw_max=1.2,
        iw_capped_fraction=0.0, clip_fraction_low=0.04, clip_fraction_high=0.06, entropy=1.5,
        response_length_mean=31.5, truncated_fraction=0.25, num_groups=4, zero_variance_groups=1,
        staleness_histogram=(10,), stale_tokens=0, num_tokens=100, num_branch_tokens=0, num_trainable_tokens=60,
        num_micro_batches=1, num_updates=1, grad_norm=1.0, duration_ms=5.0, trajectory_ids=("t",),
    )
    origin = StepOrigin("run", "trainer", "a1")
    plain = completed_event(origin, result)
    assert plain.zero_variance_fraction == 0.25 and plain.filtered_group_ids == ()
    event = completed_event(origin, result, Fill(("g",), filtered=("f1", "f2"), added=("s",)))
    assert event.zero_variance_fraction == pytest.approx(3 / 6)  # 1 of 4 trained + 2 filtered, of 6
    assert event.filtered_group_ids == ("f1", "f2") and event.added_group_ids == ("s",)
    assert (event.entropy, event.response_length_mean, event.truncated_fraction) == (1.5, 31.5, 0.25)
    assert (event.clip_fraction_low, event.clip_fraction_high, event.kl) == (0.04, 0.06, 0.01)
