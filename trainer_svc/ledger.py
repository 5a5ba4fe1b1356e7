"""The trainer's ledger: which messages are still needed, which ids are done, and where a restart reads.

Exactly-once training across restarts: the checkpoint is the only record of progress
    The state stored with every checkpoint (`Ledger.to_state`, in its `consumed_offsets`) holds, per
    input topic partition, the offset to resume from: the oldest message still needed (an untrained
    buffered trajectory, the BatchReady of an untrained group, a pending assignment or its TrainData),
    else the next unread offset. Messages after that offset may already have been trained on (a later
    group trained while an older one was still incomplete), so the state also lists the trained (or
    dropped) trajectory and group ids a restart will read again, plus those of the last `dedupe_steps`
    steps for late duplicates (the trajectory processor is at-least-once; copies share the trajectory
    id). On start the service loads the newest checkpoint, assigns the input partitions itself at the
    stored offsets (no consumer-group position is used or needed) and skips ids already trained.

No Kafka here: the shell feeds it what it read, with the `Position` it was read at.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schemas.events import BatchReady, Trajectory
from schemas.rollout_events import is_held_out
from trainer_svc.buffer import GroupBuffer, PendingStep, Position
from trainer_svc.collapse_guard import StepMetrics
from trainer_svc.errors import CheckpointError

STATE_FORMAT = 1


@dataclass(frozen=True)
class Done:
    """A trajectory or group trained (or dropped) at `step`, and where its messages were read."""

    step: int
    positions: tuple[Position, ...]

    def to_json(self) -> list[Any]:
        return [self.step, [list(p) for p in self.positions]]

    @classmethod
    def from_json(cls, data: Sequence[Any]) -> Done:
        return cls(int(data[0]), tuple(Position(str(t), int(p), int(o)) for t, p, o in data[1]))


def _latest_per_partition(positions: Iterable[Position]) -> tuple[Position, ...]:
    latest: dict[tuple[str, int], int] = {}
    for p in positions:
        latest[(p.topic, p.partition)] = max(latest.get((p.topic, p.partition), -1), p.offset)
    return tuple(Position(t, part, o) for (t, part), o in sorted(latest.items()))


class Ledger:
    """Everything the shell knows between checkpoints, without Kafka: which messages are still needed,
    which ids are done, and from where a restart must read. `to_state` / `from_state` are what goes
    into the checkpoint's `consumed_offsets`."""

    def __init__(self, dedupe_steps: int) -> None:
        self.dedupe_steps = dedupe_steps
        self.groups: dict[str, GroupBuffer] = {}
        self.pending: dict[str, PendingStep] = {}
        self.foreign: set[str] = set()
        self.done_trajectories: dict[str, Done] = {}
        self.done_groups: dict[str, Done] = {}
        self.next_offsets: dict[tuple[str, int], int | None] = {}
        self.last_step: dict[str, Any] = {}
        self.step_metrics: list[StepMetrics] = []  # what the collapse guard reads (`collapse_guard.keep`)
        self._ready_seq = 0

    # -- restart state

    def resume_offsets(self) -> dict[tuple[str, int], int | None]:
        """Per partition: the oldest still-needed message, else the next unread one (None: the beginning)."""
        needed: dict[tuple[str, int], int] = {}
        positions = [p for g in self.groups.values() for p in g.positions()]
        positions += [p for s in self.pending.values() for p in s.positions()]
        for p in positions:
            key = (p.topic, p.partition)
            needed[key] = min(needed.get(key, p.offset), p.offset)
        out = dict(self.next_offsets)
        for key, offset in needed.items():
            out[key] = offset
        return out

    def prune(self, current_step: int) -> None:
        """Forgets done ids that a restart does not read again and that are older than the dedupe window."""
        resume = self.resume_offsets()

        def keep(done: Done) -> bool:
            if done.step > current_step - self.dedupe_steps:
                return True
            for p in done.positions:
                start = resume.get((p.topic, p.partition))
                if start is None or p.offset >= start:
                    return True
            return False

        self.done_trajectories = {k: d for k, d in self.done_trajectories.items() if keep(d)}
        self.done_groups = {k: d for k, d in self.done_groups.items() if keep(d)}

    def to_state(self, current_step: int) -> dict[str, Any]:
        self.prune(current_step)
        offsets: dict[str, dict[str, int | None]] = {}
        for (topic, partition), offset in sorted(self.resume_offsets().items()):
            offsets.setdefault(topic, {})[str(partition)] = offset
        return {
            "format": STATE_FORMAT,
            "offsets": offsets,
            "done_trajectories": {k: d.to_json() for k, d in sorted(self.done_trajectories.items())},
            "done_groups": {k: d.to_json() for k, d in sorted(self.done_groups.items())},
            "last_step": self.last_step,
            "step_metrics": [m.to_json() for m in self.step_metrics],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], dedupe_steps: int) -> Ledger:
        ledger = cls(dedupe_steps)
        if not state:
            return ledger
        if state.get("format") != STATE_FORMAT:
            raise CheckpointError(f"consumed_offsets format {state.get('format')!r}, expected {STATE_FORMAT}")
        for topic, partitions in state.get("offsets", {}).items():
            for partition, offset in partitions.items():
                ledger.next_offsets[(topic, int(partition))] = None if offset is None else int(offset)
        ledger.done_trajectories = {k: Done.from_json(v) for k, v in state.get("done_trajectories", {}).items()}
        ledger.done_groups = {k: Done.from_json(v) for k, v in state.get("done_groups", {}).items()}
        ledger.last_step = dict(state.get("last_step", {}))
        ledger.step_metrics = [StepMetrics.from_json(m) for m in state.get("step_metrics", [])]
        return ledger

    # -- inputs

    def read(self, position: Position) -> None:
        self.next_offsets[(position.topic, position.partition)] = position.offset + 1

    def add_trajectory(self, t: Trajectory, position: Position) -> str:
        """Buffers a trajectory; returns what happened to it (buffered, duplicate, late, held_out)."""
        if is_held_out(t.group_id):
            return "held_out"  # an evaluation's session: never trained on, so never buffered
        if t.trajectory_id in self.done_trajectories:
            return "duplicate"
        key = t.group_id or t.trajectory_id
        if key in self.done_groups:
            return "late"
        group = self.groups.setdefault(key, GroupBuffer(key))
        if t.trajectory_id in group.trajectories or t.trajectory_id in group.dropped:
            return "duplicate"
        group.trajectories[t.trajectory_id] = (t, position)
        if not t.group_id and not group.solo:
            group.solo, group.ready_seq = True, self._next_seq()
        return "buffered"

    def drop_trajectory(self, t: Trajectory, position: Position, step: int) -> None:
        """A trajectory that cannot be trained (dead-lettered): done, and no longer awaited by its group."""
        self.done_trajectories[t.trajectory_id] = Done(step, (position,))
        key = t.group_id or t.trajectory_id
        group = self.groups.setdefault(key, GroupBuffer(key))
        group.dropped.add(t.trajectory_id)
        group.trajectories.pop(t.trajectory_id, None)
        if not t.group_id:
            self.groups.pop(key, None)

    def add_batch_ready(self, b: BatchReady, position: Position) -> str:
        if is_held_out(b.group_id):
            return "held_out"
        if b.group_id in self.done_groups:
            return "late"
        group = self.groups.setdefault(b.group_id, GroupBuffer(b.group_id))
        if group.ready is not None:
            return "duplicate"
        group.ready, group.ready_at, group.ready_seq = b, position, self._next_seq()
        return "buffered"

    def _next_seq(self) -> int:
        self._ready_seq += 1
        return self._ready_seq

    def complete_groups(self) -> list[GroupBuffer]:
        """Complete groups, oldest BatchReady first."""
        return sorted((g for g in self.groups.values() if g.complete()), key=lambda g: g.ready_seq)

    def finish(self, group_ids: Iterable[str], step: int) -> None:
        """Marks groups (and every trajectory buffered for them) done at `step`; they leave the buffer.
        A group not buffered at all (assigned, never arrived) is done too: its late samples are ignored."""
        for gid in group_ids:
            group = self.groups.pop(gid, None)
            if group is None:
                self.done_groups[gid] = Done(step, ())
                continue
            for tid, (_, position) in group.trajectories.items():
                self.done_trajectories[tid] = Done(step, (position,))
            self.done_groups[gid] = Done(step, _latest_per_partition(group.positions()))

    def stale_groups(self, version: int, bound: int | None) -> list[GroupBuffer]:
        """Groups whose newest generated token is more than `bound` versions old. Only groups whose
        BatchReady arrived count (its max_version covers members not here yet): a member still to come
        may be fresher."""
        if bound is None:
            return []
        return [g for g in self.groups.values()
                if (g.ready is not None or g.solo) and 0 <= g.newest_version() < version - bound]
