"""Which data a train step trains on: a plain function of the trajectories and the algorithm config.

  * a member with a skipped status (default: aborted) or without tokens (a failed session, an empty
    trajectory) is not trained on; it still counts for its group's completion (upstream), but it is
    not part of the group's GRPO baseline: the group trains on its remaining members;
  * GRPO: a group with fewer than `min_group_members` usable members, or (with
    `drop_zero_variance_groups`) whose usable members all have one reward, is dropped; dropped groups
    and why are reported (`StepResult.dropped_groups` -> TrainStepCompleted.dropped_group_ids / reason);
  * a usable member's reward that is NaN, infinite or beyond `max_abs_reward` refuses the whole step
    (`NonFiniteError`) before anything is computed: refused, not clamped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.events import Trajectory
from trainer_svc.config import AlgorithmConfig
from trainer_svc.errors import NonFiniteError


def group_key(trajectory: Trajectory) -> str:
    return trajectory.group_id or trajectory.task_id or trajectory.trajectory_id


def describe_dropped(dropped: Sequence[tuple[str, str]]) -> str:
    return "; ".join(f"{group}: {why}" for group, why in dropped)


@dataclass(frozen=True)
class Selection:
    """What a step trains on: the kept trajectories (input order), the others, the dropped groups."""

    kept: tuple[Trajectory, ...]
    skipped_ids: tuple[str, ...]
    dropped_groups: tuple[tuple[str, str], ...]
    num_groups: int = 0  # groups with a usable member
    zero_variance_groups: int = 0  # of those, groups whose usable members all have one reward


def usable(trajectory: Trajectory, algo: AlgorithmConfig) -> bool:
    """A member that has tokens to train on and a status whose reward means something."""
    return trajectory.status not in algo.skip_statuses and bool(trajectory.nodes)


def check_rewards(trajectories: Sequence[Trajectory], max_abs_reward: float) -> None:
    """Raises `NonFiniteError` naming every reward that is NaN, infinite or beyond the bound."""
    bad = [t for t in trajectories if not math.isfinite(t.reward) or abs(t.reward) > max_abs_reward]
    if bad:
        named = ", ".join(f"{t.trajectory_id!r}={t.reward!r}" for t in bad[:5])
        raise NonFiniteError(f"{len(bad)} reward(s) not finite or beyond max_abs_reward={max_abs_reward:g}: "
                             f"{named}; step refused")


def zero_variance(members: Sequence[Trajectory], algo: AlgorithmConfig) -> bool:
    """A group whose usable members all have one reward: every GRPO advantage in it is 0 (no gradient).
    A group without a usable member has no reward at all, so it is not counted as one."""
    return len({t.reward for t in members if usable(t, algo)}) == 1


def select_trainable(trajectories: Sequence[Trajectory], algo: AlgorithmConfig) -> Selection:
    """The members and groups a step trains on (see the module docstring); raises `NonFiniteError`
    when a usable member's reward cannot be trained on."""
    members = [t for t in trajectories if usable(t, algo)]
    check_rewards(members, algo.max_abs_reward)
    dropped: dict[str, str] = {}
    for t in trajectories:
        if not usable(t, algo):
            dropped.setdefault(group_key(t), "no usable member")
    by_group: dict[str, list[Trajectory]] = {}
    for t in members:
        by_group.setdefault(group_key(t), []).append(t)
    if algo.algorithm == "grpo":
        for key, group in by_group.items():
            if len(group) < algo.min_group_members:
                dropped[key] = f"{len(group)} usable member(s), fewer than min_group_members={algo.min_group_members}"
            elif algo.drop_zero_variance_groups and zero_variance(group, algo):
                dropped[key] = f"zero reward variance (every usable member has reward {group[0].reward!r})"
            else:
                dropped.pop(key, None)
    else:
        for t in members:
            dropped.pop(group_key(t), None)
    kept = tuple(t for t in members if group_key(t) not in dropped)
    kept_ids = {t.trajectory_id for t in kept}
    return Selection(
        kept=kept,
        skipped_ids=tuple(t.trajectory_id for t in trajectories if t.trajectory_id not in kept_ids),
        dropped_groups=tuple(sorted(dropped.items())),
        num_groups=len(by_group),
        zero_variance_groups=sum(zero_variance(g, algo) for g in by_group.values()),
    )
