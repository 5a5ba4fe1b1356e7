"""Task groups: counts trajectories per group and fires one BatchReady when a group has its n samples.

Group size
    A group is ready when it holds n distinct trajectories; n comes from `GroupTracker.expect` (the
    shell may call it for each TaskDispatched), from the session's SessionStarted metadata
    (`group_size_key`, default "n_samples"), or from `AssemblerConfig.group_size`, in that order of
    precedence; the first known size of a group is kept. Trajectories for a group that already
    fired are counted (`late_samples`) and not batched again. The tracker's state is not in the
    session deltas: the shell rebuilds it by feeding the `trajectories` topic to `GroupTracker.add`.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from agents_adapter.errors import ConfigError
from agents_adapter.processor.session_records import NAMESPACE
from schemas.events import BatchReady, Trajectory

logger = logging.getLogger(__name__)

_LOG: Final = {"service": "agents_adapter"}


def batch_event_id(group_id: str) -> str:
    return uuid.uuid5(NAMESPACE, f"BatchReady/{group_id}").hex


class _Member(NamedTuple):
    """What a group needs of a trajectory (not its tokens: groups wait for their slowest sample)."""

    min_version: int
    max_version: int
    ts_ms: int


@dataclass
class _Group:
    task_id: str = ""
    size: int | None = None
    members: dict[str, _Member] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupState:
    """A pending group: its size (None = not known yet), task and members (id, min/max version, ts)."""

    group_id: str
    size: int | None
    task_id: str
    members: tuple[tuple[str, int, int, int], ...]


class GroupTracker:
    """Counts trajectories per task group and fires one BatchReady when a group has its n samples."""

    def __init__(self, default_size: int | None = None, producer: str = "trajectory-processor") -> None:
        if default_size is not None and default_size < 1:
            raise ConfigError(f"default_size must be >= 1 or None, got {default_size!r}")
        self.default_size = default_size
        self.producer = producer
        self.ready_groups = 0
        self.late_samples = 0
        self.duplicate_samples = 0
        self._groups: dict[str, _Group] = {}
        self._done: dict[str, int] = {}

    def expect(self, group_id: str, n: int, task_id: str = "") -> BatchReady | None:
        """Sets a group's size (the first size given wins); fires if the group is already complete."""
        if n < 1:
            raise ConfigError(f"group size of {group_id!r} must be >= 1, got {n}")
        if not group_id or group_id in self._done:
            return None
        group = self._groups.setdefault(group_id, _Group())
        if group.size is None:
            group.size = n
        elif group.size != n:
            logger.warning("group size %d ignored, keeping %d", n, group.size, extra={**_LOG, "group": group_id})
        group.task_id = group.task_id or task_id
        return self._fire_if_ready(group_id, group)

    def add(self, trajectory: Trajectory) -> BatchReady | None:
        """Counts a trajectory (once per trajectory_id) and returns the group's BatchReady when complete."""
        return self.add_member(trajectory.group_id, trajectory.trajectory_id, trajectory.task_id,
                               trajectory.min_version, trajectory.max_version, trajectory.ts_ms)

    def add_member(self, group_id: str, trajectory_id: str, task_id: str, min_version: int, max_version: int,
                   ts_ms: int) -> BatchReady | None:
        """`add` for a shell that forwards only what a group needs of a trajectory (not its tokens)."""
        if not group_id:
            return None
        if group_id in self._done:
            self.late_samples += 1
            return None
        group = self._groups.setdefault(group_id, _Group())
        if trajectory_id in group.members:
            self.duplicate_samples += 1
            return None
        group.members[trajectory_id] = _Member(min_version, max_version, ts_ms)
        group.task_id = group.task_id or task_id
        return self._fire_if_ready(group_id, group)

    def group_state(self, group_id: str) -> GroupState | None:
        """What a shell persists of a group that has not fired (restored with `expect` + `add_member`)."""
        group = self._groups.get(group_id)
        if group is None:
            return None
        return GroupState(group_id, group.size, group.task_id, tuple(
            (tid, m.min_version, m.max_version, m.ts_ms) for tid, m in group.members.items()))

    def is_done(self, group_id: str) -> bool:
        return group_id in self._done

    def restore_done(self, group_id: str, ts_ms: int) -> None:
        """Remembers that a group fired (a restarted shell's persisted marker): later samples are late."""
        self._groups.pop(group_id, None)
        self._done[group_id] = ts_ms

    def pending(self, group_id: str) -> int:
        """Trajectories counted for a group that has not fired yet."""
        group = self._groups.get(group_id)
        return len(group.members) if group else 0

    def forget(self, before_ts_ms: int) -> int:
        """Drops the memory of groups that fired before a time; returns how many.

        A sample arriving for a forgotten group starts counting it afresh; should that group fire
        again, its BatchReady has the same event id as the first, and consumers drop it.
        """
        old = [g for g, ts in self._done.items() if ts < before_ts_ms]
        for g in old:
            del self._done[g]
        return len(old)

    def _fire_if_ready(self, group_id: str, group: _Group) -> BatchReady | None:
        size = group.size if group.size is not None else self.default_size
        if size is None or len(group.members) < size:
            return None
        ids = sorted(group.members)
        generated = [m for m in group.members.values() if m.max_version >= 0]
        ts = max(m.ts_ms for m in group.members.values())
        self.ready_groups += 1
        del self._groups[group_id]
        self._done[group_id] = ts
        return BatchReady(
            event_id=batch_event_id(group_id),
            ts_ms=ts,
            producer=self.producer,
            correlation_id=group_id,
            group_id=group_id,
            task_id=group.task_id,
            trajectory_ids=tuple(ids),
            num_samples=len(ids),
            min_version=min((m.min_version for m in generated), default=-1),
            max_version=max((m.max_version for m in generated), default=-1),
            ready_groups=self.ready_groups,
        )

