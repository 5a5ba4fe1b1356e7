"""Dynamic sampling (DAPO): which groups a step takes when groups with zero reward variance are filtered.

A GRPO group whose members all got one reward has every advantage 0: trained on, it only dilutes the
loss of the others, and counted as one of the step's groups it leaves the step with less signal than
configured. With `AlgorithmConfig.dynamic_sampling` such a group is filtered (done, never trained,
reported in `TrainStepCompleted.filtered_group_ids`) and the step takes further complete groups from
the stream in its place, within `dynamic_sampling_max_filtered`. When and on which groups a step runs
otherwise is the planner's (`trainer_svc.planner`); this module only changes the group list. No Kafka:
plain functions of the ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from trainer_svc.config import AlgorithmConfig
from trainer_svc.ledger import Ledger
from trainer_svc.selection import usable, zero_variance


@dataclass(frozen=True)
class Fill:
    """The groups a step trains on, the zero-variance groups it filtered, and (scheduled) the groups it
    took beyond its assignment in their place."""

    group_ids: tuple[str, ...]
    filtered: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    filtered_rewards: tuple[float, ...] = field(default=(), compare=False)  # the filtered sessions' (collapse guard)

    def describe(self) -> str:
        return (f"dynamic sampling: {len(self.filtered)} group(s) with zero reward variance filtered, "
                f"{len(self.group_ids)} with variance")


def _zero_variance(ledger: Ledger, group_id: str, algo: AlgorithmConfig) -> bool:
    group = ledger.groups.get(group_id)
    return group is not None and zero_variance(group.ordered(), algo)


def _has_variance(ledger: Ledger, group_id: str, algo: AlgorithmConfig) -> bool:
    group = ledger.groups.get(group_id)
    return group is not None and len({t.reward for t in group.ordered() if usable(t, algo)}) > 1


def standalone_fill(ledger: Ledger, groups_per_step: int, algo: AlgorithmConfig) -> Fill | None:
    """The next standalone step: the oldest `groups_per_step` complete groups (None: not enough yet).

    With dynamic sampling, zero-variance groups are passed over and the step waits for more until it
    has `groups_per_step` groups with variance, or `dynamic_sampling_max_filtered` groups were passed
    over: then it takes the groups with variance found so far (none: an empty step, which the service
    reports as skipped)."""
    ready = [g.group_id for g in ledger.complete_groups()]
    if not algo.dynamic_sampling:
        return Fill(tuple(ready[:groups_per_step])) if len(ready) >= groups_per_step else None
    kept: list[str] = []
    filtered: list[str] = []
    for gid in ready:
        (filtered if _zero_variance(ledger, gid, algo) else kept).append(gid)
        if len(kept) == groups_per_step or len(filtered) >= algo.dynamic_sampling_max_filtered:
            return Fill(tuple(kept), tuple(filtered), filtered_rewards=rewards_of(ledger, filtered))
    return None


def scheduled_fill(ledger: Ledger, assigned: Sequence[str], algo: AlgorithmConfig) -> Fill:
    """An assigned step's groups: without dynamic sampling the assignment's; with it, the assigned groups
    whose buffered members have zero reward variance are filtered and as many complete groups with
    variance that no pending assignment names (oldest first, at most `dynamic_sampling_max_filtered`) are
    added. When that would leave nothing to train on, the step keeps its assigned groups (see
    `AlgorithmConfig.dynamic_sampling`)."""
    if not algo.dynamic_sampling:
        return Fill(tuple(assigned))
    filtered = [gid for gid in assigned if gid not in ledger.done_groups and _zero_variance(ledger, gid, algo)]
    if not filtered:
        return Fill(tuple(assigned))
    named = {gid for p in ledger.pending.values() for gid in p.group_ids} | set(assigned)
    spare = [g.group_id for g in ledger.complete_groups()
             if g.group_id not in named and _has_variance(ledger, g.group_id, algo)]
    added = spare[:min(len(filtered), algo.dynamic_sampling_max_filtered)]
    kept = [gid for gid in assigned if gid not in filtered]
    has_data = [gid for gid in kept if gid in ledger.groups and ledger.groups[gid].trajectories]
    if not has_data and not added:
        return Fill(tuple(assigned))
    return Fill((*kept, *added), tuple(filtered), tuple(added), rewards_of(ledger, filtered))


def rewards_of(ledger: Ledger, group_ids: Sequence[str]) -> tuple[float, ...]:
    """The rewards of the buffered sessions of `group_ids`."""
    return tuple(t.reward for gid in group_ids if gid in ledger.groups for t in ledger.groups[gid].ordered())
