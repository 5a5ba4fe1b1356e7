"""The trainer's step planner: which assignments are this trainer's, when a step runs, and on what.

No Kafka here: the shell hands over what it read and the ledger; the planner records it there and
says what to do. The shell logs each outcome and runs the steps.

When a step runs
    scheduled   a train `Assignment` naming one of this trainer's resources opens a step. Its groups
                come from the scheduler's `TrainData` events of that assignment (topic `train`, streamed
                in chunks, the last one `final`) and/or from its payload (`schemas.payloads.
                AssignmentPayload.group_ids`, with `final` False when TrainData adds more; the scheduler
                leaves them out). An assignment of another run (`run_id`) is ignored, one whose payload
                is not an AssignmentPayload is dead-lettered. Once the list is final the step waits until
                every listed group is complete (its BatchReady and all its trajectories are here), at
                most `group_wait_s`, then trains on what is there and logs the missing groups. The step
                trains policy version `Assignment.policy_version`; an assignment for an older version is
                a duplicate (skipped), one for a newer version cannot be trained (logged, dropped). All
                chunks of an assignment go into one `Trainer.train_step` (one policy update).
    standalone  a step runs whenever `groups_per_step` complete groups are buffered (oldest BatchReady
                first). A trajectory without a group id is a group of its own, complete on arrival.
    Either way a group (with its BatchReady) whose newest token is more than `max_staleness` versions
    old is dropped untrained (`Ledger.stale_groups`): every one of its tokens would be masked out of the
    loss. In scheduled mode the scheduler's `TaskCompleted` with status aborted / dropped (a straggler
    or a group timeout) drops that group from the buffer too: it will never be assigned.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.errors import PayloadError
from schemas.events import Assignment, TrainData, Trajectory
from schemas.payloads import AssignmentPayload
from trainer_svc.buffer import PendingStep, Position
from trainer_svc.ledger import Ledger

TRAIN_TASK = "train"
#: TaskCompleted statuses of a group the scheduler gave up on (never to be assigned to a step).
ABANDONED_STATUSES = ("aborted", "dropped")


class Intake(enum.Enum):
    """What became of an Assignment read from `scheduler`."""

    ACCEPTED = "accepted"
    COPY = "copy"  # a second copy of an assignment already pending
    FOREIGN = "foreign"  # another task kind, or another trainer's resources
    OTHER_RUN = "other_run"
    OLD_VERSION = "old_version"  # trained already: a duplicate of a past step


def take_assignment(ledger: Ledger, a: Assignment, position: Position, *, run_id: str,
                    resource_ids: Sequence[str], version: int, now: float) -> Intake:
    """Records an Assignment in the ledger when it opens a step of this trainer at `version` or later,
    with the groups its payload names (`AssignmentPayload.group_ids`; None: they come as TrainData).

    A train assignment of this trainer whose payload cannot be read is recorded as not this trainer's,
    then raises `PayloadError` (the shell dead-letters it)."""
    if a.task_kind != TRAIN_TASK or not set(a.resource_ids) & set(resource_ids):
        return _refuse(ledger, a, Intake.FOREIGN)
    try:
        payload = AssignmentPayload.from_json(a.payload)
    except PayloadError:
        _refuse(ledger, a, Intake.FOREIGN)
        raise
    if payload.run_id not in ("", run_id):
        return _refuse(ledger, a, Intake.OTHER_RUN)
    if a.policy_version < version:
        return _refuse(ledger, a, Intake.OLD_VERSION)
    pending = ledger.pending.setdefault(a.assignment_id, PendingStep(a.assignment_id))
    if pending.assignment is not None:
        return Intake.COPY
    pending.assignment, pending.position, pending.step = a, position, a.step
    if payload.group_ids is not None:
        pending.add_groups(payload.group_ids, payload.final, now)
    return Intake.ACCEPTED


def _refuse(ledger: Ledger, a: Assignment, intake: Intake) -> Intake:
    """No step for this assignment; TrainData of a foreign one (or of another run) is ignored from now on."""
    if intake is not Intake.OLD_VERSION:
        ledger.foreign.add(a.assignment_id)
    ledger.pending.pop(a.assignment_id, None)
    return intake


def take_train_data(ledger: Ledger, d: TrainData, position: Position, *, run_id: str, version: int,
                    now: float) -> None:
    """Adds a TrainData chunk's groups to its assignment (which may not have been read yet)."""
    if d.run_id != run_id or d.assignment_id in ledger.foreign or d.step < version:
        return
    pending = ledger.pending.setdefault(d.assignment_id, PendingStep(d.assignment_id, step=d.step))
    pending.data_positions.append(position)
    pending.add_groups(d.group_ids, d.final, now)


def abandon_group(ledger: Ledger, group_id: str, step: int) -> int | None:
    """The scheduler aborted or dropped a group: no step will take it, so its members leave the buffer
    (they would otherwise pin the resume offsets for ever). A group already assigned is kept (None);
    otherwise returns how many of its trajectories were buffered."""
    if not group_id or group_id in ledger.done_groups:
        return None
    if any(group_id in p.group_ids for p in ledger.pending.values()):
        return None
    buffered = ledger.groups.get(group_id)
    ledger.finish([group_id], step)
    return 0 if buffered is None else len(buffered.trajectories)


def standalone_groups(ledger: Ledger, groups_per_step: int) -> list[str]:
    """The groups of the next standalone step: the oldest complete ones, once there are enough (else [])."""
    ready = ledger.complete_groups()
    return [g.group_id for g in ready[:groups_per_step]] if len(ready) >= groups_per_step else []


def next_assignment(ledger: Ledger, version: int) -> tuple[PendingStep | None, list[PendingStep]]:
    """The oldest assignment that can run at `version`, and those for other versions (dropped from the
    ledger: an older one was trained already, a newer one cannot be)."""
    dropped: list[PendingStep] = []
    candidates = [p for p in ledger.pending.values() if p.assignment is not None]
    for p in sorted(candidates, key=lambda p: (p.assignment.policy_version if p.assignment else 0,
                                               p.position.offset if p.position else 0)):
        assert p.assignment is not None
        if p.assignment.policy_version == version:
            return p, dropped
        dropped.append(ledger.pending.pop(p.assignment_id))
    return None, dropped


def ready_to_run(ledger: Ledger, pending: PendingStep, group_wait_s: float, now: float) -> bool:
    """A final group list whose groups are all here (complete or trained), or waited for long enough."""
    if not pending.final:
        return False
    here = all(gid in ledger.done_groups or (gid in ledger.groups and ledger.groups[gid].complete())
               for gid in pending.group_ids)
    waited = now - (pending.final_since if pending.final_since is not None else now)
    return here or waited >= group_wait_s


@dataclass(frozen=True)
class StepPlan:
    """A step's groups sorted by what is buffered for them, and the trajectories it trains on."""

    trajectories: tuple[Trajectory, ...]
    trained: tuple[str, ...]  # groups with buffered trajectories
    missing: tuple[str, ...]  # nothing here (never arrived)
    partial: tuple[str, ...]  # trained although incomplete (waited long enough)
    already: tuple[str, ...]  # trained by an earlier step
    empty: tuple[str, ...]  # complete, but every member was dead-lettered

    @property
    def untrained_if_skipped(self) -> tuple[str, ...]:
        """The groups a skipped step reports (the scheduler dispatches their tasks again)."""
        return (*self.trained, *self.missing, *self.empty)

    def nothing_reason(self) -> str:
        return (f"nothing to train on: {len(self.missing)} group(s) missing, {len(self.empty)} with every member "
                f"dead-lettered, {len(self.already)} already trained")


def plan_step(ledger: Ledger, group_ids: Sequence[str]) -> StepPlan:
    """What a step on `group_ids` trains on, from what the ledger holds (the ledger is not changed)."""
    trajectories: list[Trajectory] = []
    trained: list[str] = []
    missing, partial, already, empty = [], [], [], []
    for gid in group_ids:
        group = ledger.groups.get(gid)
        if gid in ledger.done_groups:
            already.append(gid)
        elif group is not None and not group.trajectories and group.complete():
            empty.append(gid)
        elif group is None or not group.trajectories:
            missing.append(gid)
        else:
            if not group.complete():
                partial.append(gid)
            trajectories.extend(group.ordered())
            trained.append(gid)
    return StepPlan(tuple(trajectories), tuple(trained), tuple(missing), tuple(partial), tuple(already),
                    tuple(empty))
