"""What the trainer holds between steps: task groups being gathered and train assignments not yet run.

Plain records, no Kafka: every message is kept with the `Position` it was read at, because the
restart offsets (`trainer_svc.ledger`) are computed from the oldest position still needed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from schemas.events import Assignment, BatchReady, Trajectory


class Position(NamedTuple):
    """Where a message was read."""

    topic: str
    partition: int
    offset: int


@dataclass
class GroupBuffer:
    """A task group's trajectories so far and, once the processor fired it, its BatchReady.

    A trajectory without a group id is a group of its own (`solo`), complete on arrival.
    """

    group_id: str
    trajectories: dict[str, tuple[Trajectory, Position]] = field(default_factory=dict)
    ready: BatchReady | None = None
    ready_at: Position | None = None
    ready_seq: int = -1
    dropped: set[str] = field(default_factory=set)
    solo: bool = False

    def complete(self) -> bool:
        if self.solo:
            return True
        if self.ready is None:
            return False
        return all(t in self.trajectories or t in self.dropped for t in self.ready.trajectory_ids)

    def newest_version(self) -> int:
        versions = [t.max_version for t, _ in self.trajectories.values()]
        if self.ready is not None:
            versions.append(self.ready.max_version)
        return max(versions, default=-1)

    def positions(self) -> list[Position]:
        found = [p for _, p in self.trajectories.values()]
        return found + ([self.ready_at] if self.ready_at is not None else [])

    def ordered(self) -> list[Trajectory]:
        """Trajectories in id order: a redone step trains the same list in the same order."""
        return [self.trajectories[k][0] for k in sorted(self.trajectories)]


@dataclass
class PendingStep:
    """A train assignment of this trainer that has not run yet, with the groups named for it so far.

    `final_since` is the (monotonic) time the group list became final: the step waits at most
    `group_wait_s` from then for its groups to complete.
    """

    assignment_id: str
    assignment: Assignment | None = None
    position: Position | None = None
    group_ids: list[str] = field(default_factory=list)
    final: bool = False
    final_since: float | None = None
    data_positions: list[Position] = field(default_factory=list)
    step: int = -1

    def add_groups(self, group_ids: Iterable[str], final: bool, now: float) -> None:
        for gid in group_ids:
            if gid not in self.group_ids:
                self.group_ids.append(gid)
        if final and not self.final:
            self.final, self.final_since = True, now

    def positions(self) -> list[Position]:
        return ([self.position] if self.position is not None else []) + self.data_positions
