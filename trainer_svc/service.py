"""The trainer service: the imperative shell around `Trainer` (`python -m trainer_svc`).

It consumes `trajectories` (Trajectory, BatchReady) and, in `scheduled` mode, `scheduler` (Assignment,
Preemption) and `train` (TrainData), buffers trajectories by group, runs train steps, writes a
checkpoint per step and publishes what each step did.

When a step runs
    scheduled   a train `Assignment` naming one of this trainer's resources opens a step. Its groups
                come from the Assignment's `payload` (`{"group_ids": [...]}`, or `{"groups": [...]}` of
                ids or of objects with a `group_id`; optional `"final": false` when more follow) and/or
                from the scheduler's `TrainData` events of that assignment (topic `train`, streamed in
                chunks, the last one `final`). Once the list is final the step waits until every listed
                group is complete (its BatchReady and all its trajectories are here), at most
                `group_wait_s`, then trains on what is there and logs the missing groups. The step
                trains policy version `Assignment.policy_version`; an assignment for an older version is
                a duplicate (skipped), one for a newer version cannot be trained (logged, dropped).
                All chunks of an assignment go into one `Trainer.train_step` (one policy update).
    standalone  a step runs whenever `groups_per_step` complete groups are buffered (oldest BatchReady
                first). A trajectory without a group id is a group of its own, complete on arrival.
    Either way a group (with its BatchReady) whose newest token is more than `max_staleness` versions
    old is dropped untrained: every one of its tokens would be masked out of the loss. A trajectory
    arriving for a group already trained or dropped is ignored (logged). In scheduled mode the
    scheduler's `TaskCompleted` with status aborted / dropped (topic `tasks`: a straggler or a group
    timeout) drops that group from the buffer too: it will never be assigned.
    An empty trajectory (a session that ended with no call) is a valid member of its group: it counts
    for the group's completion and contributes no tokens (the core leaves it out of the baseline, see
    `trainer.select_trainable`); only a malformed tree is dead-lettered.

A step that trains nothing is reported, never dropped silently
    When none of a step's data can be trained on (every group missing, empty, dropped by the core's
    group rules, or the step refused by the non-finite guard), the service publishes a
    `TrainStepCompleted` with status `skipped`, the unchanged version as `new_version`, the reason and
    the step's groups in `dropped_group_ids`, and publishes no weights. The scheduler takes it as the
    end of the step without a new version and plans the step again with fresh groups (it dispatches the
    skipped groups' tasks again, within its `max_regenerations`). A refusal after some updates of the
    step were applied (`NonFiniteError.weights_changed`) first restores the last checkpoint (or the
    base model before the first one), so weights never move on a refused step.

One step (ids: `step_event_id(run_id, step, type)`, the same for every attempt at that step)
    1. TrainStepStarted (acknowledged by Kafka before training; a redone step repeats it, same id);
    2. `Trainer.train_step`;
    3. the checkpoint `<weights_root>/<run_id>/v<new version>`: weights (safetensors, HF layout),
       optimizer, step/version and, in `consumed_offsets`, the shell state below, all committed by one
       rename;
    4. TrainStepCompleted, then WeightsPublished (version, uri, sha256, step, num_bytes). In scheduled
       mode their correlation id is the assignment id (the scheduler matches the report to its step by
       it), otherwise the run id.

Exactly-once training across restarts: the checkpoint is the only record of progress
    The shell state stored with every checkpoint holds, per input topic partition, the offset to
    resume from: the oldest message still needed (an untrained buffered trajectory, the BatchReady of
    an untrained group, a pending assignment or its TrainData), else the next unread offset. Messages
    after that offset may already have been trained on (a later group trained while an older one was
    still incomplete), so the state also lists the trained (or dropped) trajectory and group ids a
    restart will read again, plus those of the last `dedupe_steps` steps for late duplicates (the
    trajectory processor is at-least-once; copies share the trajectory id). On start the service loads
    the newest checkpoint (weights, optimizer, step, version), assigns the input partitions itself at
    the stored offsets (no consumer-group position is used or needed) and skips ids already trained.
    A crash anywhere before the checkpoint's rename redoes the step from the previous checkpoint on the
    re-read inputs (scheduled: the same assignment and groups; standalone: the first complete groups,
    which may include groups completed meanwhile; either way no trajectory is lost or trained twice). A
    crash after the rename finds the step done: its TrainStepCompleted (kept in the state, byte for
    byte) and WeightsPublished are published on start when `weights` lacks them. Consumers drop
    repeated ids: a TrainStepCompleted or WeightsPublished id always means the same step and content;
    a repeated TrainStepStarted id marks a retried step.

Test hook: `SFLOW_TRAINER_FAULT=kill-before-checkpoint@N` (or `kill-after-checkpoint@N`) makes the process
SIGKILL itself at that point of step N; nothing else reads it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from bus.admin import ensure_topics
from bus.consumer import EventConsumer, Received
from bus.errors import BusError
from bus.producer import EventProducer
from bus.replay import ReplayRange, replay
from bus.topics import spec
from schemas.events import (
    Assignment,
    BatchReady,
    Preemption,
    TaskCompleted,
    TrainData,
    TrainStepCompleted,
    TrainStepStarted,
    Trajectory,
    WeightsPublished,
    decode_event,
    encode_event,
    now_ms,
)
from trainer_svc import checkpoint as ckpt
from trainer_svc.config import ServiceConfig
from trainer_svc.errors import BatchError, CheckpointError, NonFiniteError, TrainerError
from trainer_svc.trainer import StepResult, Trainer, pack_trajectory

log = logging.getLogger(__name__)

#: uuid5 namespace of the step event ids (fixed forever: a redone step must get the same ids).
NAMESPACE = uuid.UUID("0c3f6a57-8d2e-4b61-a9c4-7e15d2b0f3a8")
STATE_FORMAT = 1
TRAJECTORIES, SCHEDULER, TRAIN, WEIGHTS, TASKS = "trajectories", "scheduler", "train", "weights", "tasks"
#: TaskCompleted statuses of a group the scheduler gave up on (never to be assigned to a step).
ABANDONED_STATUSES = ("aborted", "dropped")
SKIPPED = "skipped"
TRAIN_TASK = "train"
FAULT_ENV = "SFLOW_TRAINER_FAULT"
#: How far before a step's WeightsPublished time `weights` is searched for it at start.
REPUBLISH_SLACK_MS = 60_000


def step_event_id(run_id: str, step: int, event_type: str) -> str:
    """Id of the `event_type` event of train step `step` of a run (every attempt at the step shares it)."""
    return uuid.uuid5(NAMESPACE, f"{run_id}/{step}/{event_type}").hex


def checkpoint_dir(config: ServiceConfig, version: int) -> Path:
    return config.checkpoint_root / f"v{version:06d}"


class Position(NamedTuple):
    """Where a message was read."""

    topic: str
    partition: int
    offset: int


def groups_of_payload(payload: str) -> tuple[list[str] | None, bool]:
    """(group ids, final) named by an Assignment payload; (None, False) when it names none.

    Accepted: `{"group_ids": ["g1", ...]}`, `{"groups": ["g1", ...]}`, `{"groups": [{"group_id": "g1"}, ...]}`,
    each with an optional `"final": false` when TrainData events will add more groups.
    """
    try:
        data = json.loads(payload or "{}")
    except ValueError:
        return None, False
    if not isinstance(data, dict):
        return None, False
    items = data.get("group_ids", data.get("groups"))
    if not isinstance(items, list):
        return None, False
    ids = [item.get("group_id") if isinstance(item, dict) else item for item in items]
    return [i for i in ids if isinstance(i, str) and i], bool(data.get("final", True))


# --- what is buffered --------------------------------------------------------------------------


@dataclass
class GroupBuffer:
    """A task group's trajectories so far and, once the processor fired it, its BatchReady."""

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
    """A train assignment of this trainer that has not run yet."""

    assignment_id: str
    assignment: Assignment | None = None
    position: Position | None = None
    group_ids: list[str] = field(default_factory=list)
    final: bool = False
    final_since: float | None = None
    data_positions: list[Position] = field(default_factory=list)
    step: int = -1

    def add_groups(self, group_ids: Iterable[str], final: bool) -> None:
        for gid in group_ids:
            if gid not in self.group_ids:
                self.group_ids.append(gid)
        if final and not self.final:
            self.final, self.final_since = True, time.monotonic()

    def positions(self) -> list[Position]:
        return ([self.position] if self.position is not None else []) + self.data_positions


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


# --- the ledger: buffer, pending steps, done ids, read positions -------------------------------


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
        return ledger

    # -- inputs

    def read(self, position: Position) -> None:
        self.next_offsets[(position.topic, position.partition)] = position.offset + 1

    def add_trajectory(self, t: Trajectory, position: Position) -> str:
        """Buffers a trajectory; returns what happened to it (buffered, duplicate, late)."""
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


# --- the service -------------------------------------------------------------------------------


class TrainerService:
    """Consume, buffer, train, checkpoint, publish; see the module docstring for the guarantees."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.producer_id = f"trainer:{config.run_id}:{config.resource_ids[0]}"
        self.trainer: Trainer | None = None
        self.ledger = Ledger(config.dedupe_steps)
        self.producer: EventProducer | None = None
        self.consumer: EventConsumer | None = None
        self.steps_run = 0
        self._fault = os.environ.get(FAULT_ENV, "")

    @property
    def topics(self) -> tuple[str, ...]:
        return (TRAJECTORIES, SCHEDULER, TRAIN, TASKS) if self.config.mode == "scheduled" else (TRAJECTORIES,)

    @property
    def _trainer(self) -> Trainer:
        assert self.trainer is not None, "start() first"
        return self.trainer

    @property
    def _producer(self) -> EventProducer:
        assert self.producer is not None, "start() first"
        return self.producer

    @property
    def _consumer(self) -> EventConsumer:
        assert self.consumer is not None, "start() first"
        return self.consumer

    def _log(self, message: str, level: int = logging.INFO, **fields: Any) -> None:
        log.log(level, message, extra={"run": self.config.run_id, **fields})

    # -- start-up

    def start(self) -> None:
        """Resume from the newest checkpoint, publish what a crash left unpublished, seek the inputs."""
        config = self.config
        ensure_topics(config.bus, [spec(t) for t in (*self.topics, WEIGHTS, "dlq")])
        root = config.checkpoint_root
        self._discard_staging(root)
        self.trainer = Trainer(config.trainer_config())
        latest = ckpt.latest_checkpoint(root)
        if latest is not None:
            progress = self.trainer.load_checkpoint(latest)
            self.ledger = Ledger.from_state(progress.consumed_offsets, config.dedupe_steps)
            self._log("resumed from checkpoint", checkpoint=str(latest), step=progress.step,
                      version=progress.version, done_ids=len(self.ledger.done_trajectories))
        else:
            self._log("starting from the base model", model=config.base_model_dir, version=self.trainer.version)
        self.producer = EventProducer(config.bus, producer_id=self.producer_id)
        if latest is not None:
            self._republish_last_step(latest)
        self.consumer = EventConsumer(
            config.bus, f"trainer.{config.run_id}", self.topics, dlq=self.producer, subscribe=False
        )
        self._assign_inputs()

    @staticmethod
    def _discard_staging(root: Path) -> None:
        """Half-written checkpoints of a crashed attempt (`commit` never renamed them into place)."""
        if root.is_dir():
            for child in root.iterdir():
                if child.name.startswith(".") and ".tmp-" in child.name and child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)

    def _assign_inputs(self) -> None:
        """Every partition of the input topics at the checkpoint's offset (no stored offset: the beginning).

        The partitions are assigned, not subscribed: this process alone decides where it reads, and a
        consumer-group rebalance can never move it."""
        starts: dict[tuple[str, int], int | None] = {}
        for name in self.topics:
            topic = self.config.bus.topic(name)
            for partition in self._consumer.partitions(topic):
                offset = self.ledger.next_offsets.get((topic, partition))
                self.ledger.next_offsets[(topic, partition)] = offset
                starts[(topic, partition)] = offset
        self._consumer.assign(starts)
        self._log("consuming", starts=",".join(f"{t}[{p}]@{o}" for (t, p), o in starts.items()))

    def _republish_last_step(self, directory: Path) -> None:
        """The checkpoint was committed but its events may not have reached Kafka (crash in between)."""
        last = self.ledger.last_step
        if not last:
            return
        weights = self._weights_event(directory, int(last["weights_ts_ms"]), str(last["correlation_id"]))
        try:
            recorded = replay(self.config.bus, [WEIGHTS], ReplayRange(start_ms=weights.ts_ms - REPUBLISH_SLACK_MS))
            present = any(r.event.event_id == weights.event_id for r in recorded.events)
        except BusError as e:
            self._log("cannot read weights back; publishing the last step again", logging.WARNING, error=str(e))
            present = False
        if present:
            return
        completed = decode_event(base64.b64decode(last["completed"]))
        self._producer.publish_sync(completed)
        self._producer.publish_sync(weights)
        self._log("published the events of the last checkpointed step", step=weights.step, version=weights.version)

    # -- the loop

    def run(self, stop: threading.Event) -> None:
        """Consume and train until `stop` is set; a step in progress finishes first."""
        self.start()
        try:
            while not stop.is_set():
                for received in self._consumer.poll(self.config.poll_timeout_s):
                    self.handle(received)
                self.maybe_train()
        finally:
            self.close()

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None
        if self.producer is not None:
            self.producer.close()
            self.producer = None

    def handle(self, r: Received) -> None:
        position = Position(r.topic, r.partition, r.offset)
        self.ledger.read(position)
        event = r.event
        if isinstance(event, Trajectory):
            self._on_trajectory(r, event, position)
        elif isinstance(event, BatchReady):
            if self.ledger.add_batch_ready(event, position) == "late":
                self._log("BatchReady of a group already trained", logging.DEBUG, group=event.group_id)
        elif isinstance(event, Assignment):
            self._on_assignment(event, position)
        elif isinstance(event, TrainData):
            self._on_train_data(event, position)
        elif isinstance(event, Preemption):
            dropped = self.ledger.pending.pop(event.correlation_id, None)
            if dropped is not None:
                self._log("train assignment preempted before it ran", logging.WARNING,
                          assignment=event.correlation_id, reason=event.reason)
        elif isinstance(event, TaskCompleted) and event.status in ABANDONED_STATUSES:
            self._on_abandoned_group(event.group_id)

    def _on_abandoned_group(self, group_id: str) -> None:
        """The scheduler aborted or dropped a group: no step will take it, so its members leave the buffer
        (they would otherwise pin the resume offsets for ever). A group already assigned is kept."""
        ledger = self.ledger
        if not group_id or group_id in ledger.done_groups:
            return
        if any(group_id in p.group_ids for p in ledger.pending.values()):
            return
        buffered = ledger.groups.get(group_id)
        ledger.finish([group_id], self._trainer.step)
        self._log("group aborted by the scheduler: dropped from the buffer", logging.INFO, group=group_id,
                  trajectories=0 if buffered is None else len(buffered.trajectories))

    def _on_trajectory(self, r: Received, t: Trajectory, position: Position) -> None:
        if t.trajectory_id in self.ledger.done_trajectories:
            return
        try:
            if t.nodes:  # no nodes: a session that ended with no call, a member with no tokens
                pack_trajectory(t)
        except BatchError as e:
            self._consumer.dead_letter(r, f"trajectory cannot be trained: {e}")
            self.ledger.drop_trajectory(t, position, self._trainer.step)
            return
        if self.ledger.add_trajectory(t, position) == "late":
            self._log("trajectory of a group already trained or dropped: ignored", logging.WARNING,
                      group=t.group_id, trajectory=t.trajectory_id)

    def _ours(self, a: Assignment) -> bool:
        return a.task_kind == TRAIN_TASK and bool(set(a.resource_ids) & set(self.config.resource_ids))

    def _other_run(self, payload: str) -> str | None:
        try:
            run = json.loads(payload or "{}").get("run_id")
        except (ValueError, AttributeError):
            return None
        return run if isinstance(run, str) and run and run != self.config.run_id else None

    def _on_assignment(self, a: Assignment, position: Position) -> None:
        ledger = self.ledger
        if not self._ours(a):
            ledger.foreign.add(a.assignment_id)
            ledger.pending.pop(a.assignment_id, None)
            return
        other = self._other_run(a.payload)
        if other is not None:
            self._log("train assignment of another run ignored", logging.ERROR, assignment=a.assignment_id,
                      assignment_run=other)
            ledger.foreign.add(a.assignment_id)
            ledger.pending.pop(a.assignment_id, None)
            return
        if a.policy_version < self._trainer.version:
            self._log("train assignment for an old version skipped (already trained)", logging.INFO,
                      assignment=a.assignment_id, policy_version=a.policy_version)
            ledger.pending.pop(a.assignment_id, None)
            return
        pending = ledger.pending.setdefault(a.assignment_id, PendingStep(a.assignment_id))
        if pending.assignment is not None:
            return  # a second copy
        pending.assignment, pending.position, pending.step = a, position, a.step
        group_ids, final = groups_of_payload(a.payload)
        if group_ids is not None:
            pending.add_groups(group_ids, final)
        self._log("train assignment", assignment=a.assignment_id, policy_version=a.policy_version,
                  groups=len(pending.group_ids), final=pending.final)

    def _on_train_data(self, d: TrainData, position: Position) -> None:
        ledger = self.ledger
        if d.run_id != self.config.run_id or d.assignment_id in ledger.foreign or d.step < self._trainer.version:
            return
        pending = ledger.pending.setdefault(d.assignment_id, PendingStep(d.assignment_id, step=d.step))
        pending.data_positions.append(position)
        pending.add_groups(d.group_ids, d.final)

    # -- deciding to train

    def maybe_train(self) -> None:
        self._drop_stale_groups()
        if self.config.mode == "standalone":
            ready = self.ledger.complete_groups()
            if len(ready) >= self.config.groups_per_step:
                self.train([g.group_id for g in ready[: self.config.groups_per_step]])
            return
        pending = self._next_assignment()
        if pending is None or not pending.final:
            return
        ledger = self.ledger
        here = all(gid in ledger.done_groups or (gid in ledger.groups and ledger.groups[gid].complete())
                   for gid in pending.group_ids)
        waited = time.monotonic() - (pending.final_since or time.monotonic())
        if here or waited >= self.config.group_wait_s:
            self.train(pending.group_ids, pending)

    def _next_assignment(self) -> PendingStep | None:
        """The oldest assignment that can run now; assignments for other versions are dropped."""
        version = self._trainer.version
        candidates = [p for p in self.ledger.pending.values() if p.assignment is not None]
        for p in sorted(candidates, key=lambda p: (p.assignment.policy_version if p.assignment else 0,
                                                   p.position.offset if p.position else 0)):
            assert p.assignment is not None
            if p.assignment.policy_version == version:
                return p
            level = logging.INFO if p.assignment.policy_version < version else logging.ERROR
            self._log("train assignment for another version dropped", level, assignment=p.assignment_id,
                      policy_version=p.assignment.policy_version, version=version)
            del self.ledger.pending[p.assignment_id]
        return None

    def _drop_stale_groups(self) -> None:
        stale = self.ledger.stale_groups(self._trainer.version, self.config.staleness_bound)
        if not stale:
            return
        self._log("stale groups dropped untrained (every token beyond max_staleness)", logging.WARNING,
                  groups=",".join(g.group_id for g in stale), version=self._trainer.version)
        self.ledger.finish([g.group_id for g in stale], self._trainer.step)

    # -- one step

    def train(self, group_ids: Sequence[str], pending: PendingStep | None = None) -> StepResult | None:
        """Runs one step on the buffered trajectories of `group_ids` (see the module docstring)."""
        trainer, ledger = self._trainer, self.ledger
        trajectories: list[Trajectory] = []
        trained_groups: list[str] = []
        missing, partial, already, empty = [], [], [], []
        for gid in group_ids:
            group = ledger.groups.get(gid)
            if gid in ledger.done_groups:
                already.append(gid)
            elif group is not None and not group.trajectories and group.complete():
                empty.append(gid)  # every member was dead-lettered
            elif group is None or not group.trajectories:
                missing.append(gid)
            else:
                if not group.complete():
                    partial.append(gid)
                trajectories.extend(group.ordered())
                trained_groups.append(gid)
        if missing or partial or already:
            self._log("some assigned groups are not all here", logging.WARNING, missing=",".join(missing),
                      partial=",".join(partial), already_trained=",".join(already))
        ledger.finish(empty, trainer.step)
        if pending is not None:
            ledger.pending.pop(pending.assignment_id, None)
        step, policy_version = trainer.step + 1, trainer.version
        correlation = pending.assignment_id if pending is not None else self.config.run_id
        untrained = [*trained_groups, *missing, *empty]
        if not trajectories:
            why = (f"nothing to train on: {len(missing)} group(s) missing, {len(empty)} with every member "
                   f"dead-lettered, {len(already)} already trained")
            self._skip_step(step, correlation, untrained, why)
            return None
        self._producer.publish_sync(TrainStepStarted(
            event_id=step_event_id(self.config.run_id, step, "TrainStepStarted"),
            producer=self.producer_id, correlation_id=correlation, run_id=self.config.run_id, step=step,
            policy_version=policy_version, resource_ids=self.config.resource_ids,
            num_trajectories=len(trajectories), num_tokens=sum(t.tokens_in_tree for t in trajectories),
        ))
        started = time.perf_counter()
        try:
            result = trainer.train_step(trajectories, policy_version)
        except BatchError as e:  # nothing here can be learned from
            if isinstance(e, NonFiniteError) and e.weights_changed:
                self._restore_last_checkpoint()
            ledger.finish(trained_groups + missing, trainer.step)
            self._skip_step(step, correlation, untrained, str(e), (time.perf_counter() - started) * 1000.0)
            return None
        ledger.finish(trained_groups + missing, result.step)
        self._maybe_fault("kill-before-checkpoint", result.step)
        completed = dataclasses.replace(
            result.to_event(run_id=self.config.run_id, producer=self.producer_id),
            event_id=step_event_id(self.config.run_id, result.step, "TrainStepCompleted"), correlation_id=correlation,
        )
        weights_ts = now_ms()
        ledger.last_step = {"completed": base64.b64encode(encode_event(completed)).decode("ascii"),
                            "weights_ts_ms": weights_ts, "correlation_id": correlation}
        directory = checkpoint_dir(self.config, result.new_version)
        uri, digest = trainer.save_checkpoint(directory, consumed_offsets=ledger.to_state(result.step))
        self._maybe_fault("kill-after-checkpoint", result.step)
        weights = self._weights_event(directory, weights_ts, correlation)
        if weights.uri != uri or weights.sha256 != digest:
            raise CheckpointError(f"{directory}: reads back as {weights.uri} {weights.sha256}, saved {uri} {digest}")
        self._producer.publish_sync(completed)
        self._producer.publish_sync(weights)
        self.steps_run += 1
        self._log("step done", step=result.step, version=result.new_version, loss=f"{result.loss:.4f}",
                  trajectories=len(result.trajectory_ids), skipped=len(result.skipped_trajectory_ids),
                  groups=len(trained_groups), checkpoint=str(directory))
        return result

    def _skip_step(self, step: int, correlation: str, group_ids: Sequence[str], reason: str,
                   duration_ms: float = 0.0) -> None:
        """Reports a step that trained nothing (see the module docstring): the scheduler re-plans it.

        The id is a function of the step and its groups: a restart that re-reads the same assignment
        and skips it again publishes the same event, which consumers drop as a duplicate."""
        groups = tuple(sorted(set(group_ids)))
        detail = f"{correlation}/{','.join(groups)}"
        self._producer.publish_sync(TrainStepCompleted(
            event_id=step_event_id(self.config.run_id, step, f"TrainStepCompleted/{SKIPPED}/{detail}"),
            producer=self.producer_id, correlation_id=correlation, run_id=self.config.run_id, step=step,
            new_version=self._trainer.version, loss=0.0, reward_mean=0.0, kl=0.0, clip_fraction=0.0,
            num_tokens=0, duration_ms=duration_ms, status=SKIPPED, reason=reason, dropped_group_ids=groups,
        ))
        self._log("step skipped: nothing trainable, the scheduler plans it again", logging.WARNING, step=step,
                  assignment=correlation, groups=",".join(groups), reason=reason)

    def _restore_last_checkpoint(self) -> None:
        """Weights and optimizer back to the last published version (the base model before the first)."""
        latest = ckpt.latest_checkpoint(self.config.checkpoint_root)
        if latest is None:
            self.trainer = Trainer(self.config.trainer_config())
        else:
            self._trainer.load_checkpoint(latest)
        self._log("weights restored after a refused step", logging.WARNING,
                  checkpoint=str(latest) if latest else "base model", version=self._trainer.version)

    def _weights_event(self, directory: Path, ts_ms: int, correlation: str) -> WeightsPublished:
        """WeightsPublished of a committed checkpoint; a function of the directory (and the recorded time)."""
        progress = ckpt.read_progress(directory)
        num_bytes = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
        return WeightsPublished(
            event_id=step_event_id(self.config.run_id, progress.step, "WeightsPublished"), ts_ms=ts_ms,
            producer=self.producer_id, correlation_id=correlation, model=self.config.model,
            version=progress.version, uri=directory.resolve().as_uri(), sha256=progress.weights_sha256,
            step=progress.step, num_bytes=num_bytes,
        )

    def _maybe_fault(self, point: str, step: int) -> None:
        if self._fault == f"{point}@{step}":
            self._log("fault injection: killing the process", logging.WARNING, point=point, step=step)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)


def run_service(config: ServiceConfig, stop: threading.Event) -> int:
    """Runs the service until `stop`; the exit status of the process (1: a trainer error stopped it)."""
    service = TrainerService(config)
    try:
        service.run(stop)
    except TrainerError as e:
        log.exception("trainer failed; restart resumes from the last checkpoint",
                      extra={"run": config.run_id, "error": str(e)})
        return 1
    return 0
