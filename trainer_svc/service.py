"""The trainer service: the imperative shell around `Trainer` (`python -m trainer_svc`).

It consumes `trajectories` (Trajectory, BatchReady) and, in `scheduled` mode, `scheduler` (Assignment,
Preemption), `train` (TrainData) and `tasks` (TaskCompleted), buffers trajectories by group, runs train
steps, writes a checkpoint per step and publishes what each step did. What it holds between steps and
where a restart reads is the `ledger`; when a step runs and on which groups is the `planner`; both
are plain modules, so this shell only reads, decides through them, trains and publishes.

An empty trajectory (a session that ended with no call) is a valid member of its group: it counts for
the group's completion and contributes no tokens (the core leaves it out of the baseline, see
`selection.select_trainable`); only a malformed tree is dead-lettered. A trajectory arriving for a group
already trained or dropped is ignored (logged).

A step that trains nothing is reported, never dropped silently
    When none of a step's data can be trained on (every group missing, empty, dropped by the core's
    group rules, or the step refused by the non-finite guard), the service publishes a
    `TrainStepCompleted` with status `skipped`, the unchanged version as `new_version`, the reason and
    the step's groups in `dropped_group_ids`, and publishes no weights. The scheduler takes it as the
    end of the step without a new version and plans the step again with fresh groups (it dispatches the
    skipped groups' tasks again, within its `max_regenerations`). A refusal after some updates of the
    step were applied (`NonFiniteError.weights_changed`) first restores the last checkpoint (or the
    base model before the first one), so weights never move on a refused step.

One step (ids: `step_events.step_event_id(run_id, step, type)`, the same for every attempt at that step)
    1. TrainStepStarted (acknowledged by Kafka before training; a redone step repeats it, same id);
    2. `Trainer.train_step`;
    3. the checkpoint `<weights_root>/<run_id>/v<new version>`: weights (safetensors, HF layout),
       optimizer, step/version and, in `consumed_offsets`, the ledger's state, all committed by one
       rename;
    4. TrainStepCompleted, then WeightsPublished (version, uri, sha256, step, num_bytes). In scheduled
       mode their correlation id is the assignment id (the scheduler matches the report to its step by
       it), otherwise the run id.
    A crash anywhere before the checkpoint's rename redoes the step from the previous checkpoint on the
    re-read inputs (scheduled: the same assignment and groups; standalone: the first complete groups,
    which may include groups completed meanwhile; either way no trajectory is lost or trained twice). A
    crash after the rename finds the step done: its TrainStepCompleted (kept in the ledger's state, byte
    for byte) and WeightsPublished are published on start when `weights` lacks them.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bus.admin import ensure_topics
from bus.consumer import EventConsumer, Received
from bus.errors import BusError
from bus.producer import EventProducer
from bus.replay import ReplayRange, replay
from bus.topics import spec
from schemas.errors import PayloadError
from schemas.events import (
    Assignment,
    BatchReady,
    Preemption,
    TaskCompleted,
    TrainData,
    TrainStepCompleted,
    Trajectory,
    decode_event,
    encode_event,
    now_ms,
)
from trainer_svc import checkpoint as ckpt
from trainer_svc import planner
from trainer_svc.buffer import PendingStep, Position
from trainer_svc.collapse_guard import StepMetrics, observe
from trainer_svc.config import ServiceConfig
from trainer_svc.dynamic_sampling import Fill, scheduled_fill, standalone_fill
from trainer_svc.errors import BatchError, CheckpointError, NonFiniteError, TrainerError
from trainer_svc.ledger import Ledger
from trainer_svc.metrics import TrainerMetrics
from trainer_svc.planner import Intake
from trainer_svc.step_events import StepOrigin, completed_event, skipped_event, started_event, weights_event
from trainer_svc.step_result import StepResult
from trainer_svc.trainer import Trainer, pack_trajectory

log = logging.getLogger(__name__)

TRAJECTORIES, SCHEDULER, TRAIN, WEIGHTS, TASKS = "trajectories", "scheduler", "train", "weights", "tasks"
#: How far before a step's WeightsPublished time `weights` is searched for it at start.
REPUBLISH_SLACK_MS = 60_000
_INTAKE_LOGS = {
    Intake.OTHER_RUN: ("train assignment of another run ignored", logging.ERROR),
    Intake.OLD_VERSION: ("train assignment for an old version skipped (already trained)", logging.INFO),
}


def checkpoint_dir(config: ServiceConfig, version: int) -> Path:
    return config.checkpoint_root / f"v{version:06d}"


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
        self.metrics = TrainerMetrics(lambda: self.ledger, lambda: self.trainer.version if self.trainer else 0)

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

    def _origin(self, correlation_id: str) -> StepOrigin:
        return StepOrigin(self.config.run_id, self.producer_id, correlation_id)

    # -- start-up

    def start(self) -> None:
        """Resume from the newest checkpoint, publish what a crash left unpublished, seek the inputs."""
        config = self.config
        ensure_topics(config.bus, [spec(t) for t in (*self.topics, WEIGHTS, "dlq")])
        root = config.checkpoint_root
        ckpt.discard_staging(root)
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
            config.bus, f"trainer.{config.run_id}", self.topics, dlq=self.producer, subscribe=False,
            metrics=self.metrics.registry)
        self._assign_inputs()

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
        weights = weights_event(self._origin(str(last["correlation_id"])), self.config.model, directory,
                                int(last["weights_ts_ms"]))
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
        port = self.config.metrics_port  # served from the start: loading the model takes a while
        server = None if port is None else self.metrics.registry.serve(self.config.metrics_host, port)
        try:
            self.start()
            # Offsets live in the checkpoint (the ledger), so the loop commits none; a handler error stops
            # the service (the restart re-reads from the checkpoint).
            self._consumer.run(self.handle, stop, self.config.poll_timeout_s,
                               on_batch=lambda _batch: self.maybe_train(), on_error="raise", commit=False)
        finally:
            self.close()
            if server is not None:
                server.close()

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
            self._on_assignment(r, event, position)
        elif isinstance(event, TrainData):
            planner.take_train_data(self.ledger, event, position, run_id=self.config.run_id,
                                    version=self._trainer.version, now=time.monotonic())
        elif isinstance(event, Preemption):
            if self.ledger.pending.pop(event.correlation_id, None) is not None:
                self._log("train assignment preempted before it ran", logging.WARNING,
                          assignment=event.correlation_id, reason=event.reason)
        elif isinstance(event, TaskCompleted) and event.status in planner.ABANDONED_STATUSES:
            dropped = planner.abandon_group(self.ledger, event.group_id, self._trainer.step)
            if dropped is not None:
                self._log("group aborted by the scheduler: dropped from the buffer", logging.INFO,
                          group=event.group_id, trajectories=dropped)

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

    def _on_assignment(self, r: Received, a: Assignment, position: Position) -> None:
        try:
            intake = planner.take_assignment(self.ledger, a, position, run_id=self.config.run_id,
                                             resource_ids=self.config.resource_ids, version=self._trainer.version,
                                             now=time.monotonic())
        except PayloadError as e:
            self._consumer.dead_letter(r, f"train assignment cannot be read: {e}")
            return
        if intake in _INTAKE_LOGS:
            message, level = _INTAKE_LOGS[intake]
            self._log(message, level, assignment=a.assignment_id, policy_version=a.policy_version)
        elif intake is Intake.ACCEPTED:
            pending = self.ledger.pending[a.assignment_id]
            self._log("train assignment", assignment=a.assignment_id, policy_version=a.policy_version,
                      groups=len(pending.group_ids), final=pending.final)

    # -- deciding to train

    def maybe_train(self) -> None:
        self._drop_stale_groups()
        algo = self.config.algorithm
        if self.config.mode == "standalone":
            fill = standalone_fill(self.ledger, self.config.groups_per_step, algo)
            if fill is not None:
                self.train(fill.group_ids, fill=fill)
            return
        version = self._trainer.version
        pending, dropped = planner.next_assignment(self.ledger, version)
        for p in dropped:
            assert p.assignment is not None
            level = logging.INFO if p.assignment.policy_version < version else logging.ERROR
            self._log("train assignment for another version dropped", level, assignment=p.assignment_id,
                      policy_version=p.assignment.policy_version, version=version)
        if pending is not None and planner.ready_to_run(self.ledger, pending, self.config.group_wait_s,
                                                        time.monotonic()):
            self.train(pending.group_ids, pending, scheduled_fill(self.ledger, pending.group_ids, algo))

    def _drop_stale_groups(self) -> None:
        stale = self.ledger.stale_groups(self._trainer.version, self.config.staleness_bound)
        if not stale:
            return
        self._log("stale groups dropped untrained (every token beyond max_staleness)", logging.WARNING,
                  groups=",".join(g.group_id for g in stale), version=self._trainer.version)
        self.ledger.finish([g.group_id for g in stale], self._trainer.step)

    # -- one step

    def train(self, group_ids: Sequence[str], pending: PendingStep | None = None,
              fill: Fill | None = None) -> StepResult | None:
        """Runs one step on the buffered trajectories of `group_ids` (see the module docstring), or on
        `fill`'s groups when dynamic sampling filtered some (`trainer_svc.dynamic_sampling`)."""
        trainer, ledger = self._trainer, self.ledger
        fill = fill or Fill(tuple(group_ids))
        plan = planner.plan_step(ledger, fill.group_ids)
        if plan.missing or plan.partial or plan.already:
            self._log("some assigned groups are not all here", logging.WARNING, missing=",".join(plan.missing),
                      partial=",".join(plan.partial), already_trained=",".join(plan.already))
        if pending is not None:
            ledger.pending.pop(pending.assignment_id, None)
        step, policy_version = trainer.step + 1, trainer.version
        origin = self._origin(pending.assignment_id if pending is not None else self.config.run_id)
        untrained = (*plan.untrained_if_skipped, *fill.filtered)
        ledger.finish((*plan.empty, *fill.filtered), trainer.step)
        if not plan.trajectories:
            self._skip_step(origin, step, untrained, fill.describe() if fill.filtered else plan.nothing_reason())
            return None
        self._producer.publish_sync(started_event(origin, step, policy_version, self.config.resource_ids,
                                                  plan.trajectories))
        started = time.perf_counter()
        try:
            result = trainer.train_step(plan.trajectories, policy_version)
        except BatchError as e:  # nothing here can be learned from
            if isinstance(e, NonFiniteError) and e.weights_changed:
                self._restore_last_checkpoint()
            ledger.finish(plan.trained + plan.missing, trainer.step)
            self._skip_step(origin, step, untrained, str(e), (time.perf_counter() - started) * 1e3)
            return None
        ledger.finish(plan.trained + plan.missing, result.step)
        self.metrics.completed(result, time.perf_counter() - started)
        directory = self._checkpoint_and_publish(origin, result, fill)
        self.steps_run += 1
        self._log("step done", step=result.step, version=result.new_version, loss=f"{result.loss:.4f}",
                  trajectories=len(result.trajectory_ids), groups=len(plan.trained), filtered=len(fill.filtered),
                  added=len(fill.added), skipped=len(result.skipped_trajectory_ids), checkpoint=str(directory))
        return result

    def _checkpoint_and_publish(self, origin: StepOrigin, result: StepResult, fill: Fill) -> Path:
        """Steps 3 and 4: the step's events are kept in the checkpoint, so a crash after its rename
        publishes them on restart (`_republish_last_step`)."""
        completed = self._guarded(completed_event(origin, result, fill), fill.filtered_rewards)
        weights_ts = now_ms()
        self.ledger.last_step = {"completed": base64.b64encode(encode_event(completed)).decode("ascii"),
                                 "weights_ts_ms": weights_ts, "correlation_id": origin.correlation_id}
        directory = checkpoint_dir(self.config, result.new_version)
        uri, digest = self._trainer.save_checkpoint(directory, consumed_offsets=self.ledger.to_state(result.step))
        weights = weights_event(origin, self.config.model, directory, weights_ts)
        if weights.uri != uri or weights.sha256 != digest:
            raise CheckpointError(f"{directory}: reads back as {weights.uri} {weights.sha256}, saved {uri} {digest}")
        self._producer.publish_sync(completed)
        self._producer.publish_sync(weights)
        return directory

    def _guarded(self, event: TrainStepCompleted, filtered: Sequence[float] = ()) -> TrainStepCompleted:
        """The step's report with the collapse guard's signals (`filtered`: the filtered sessions' rewards)."""
        guard, limit, history = self.config.collapse_guard, self.config.algorithm.max_response_tokens, self.ledger
        history.step_metrics, signals = observe(history.step_metrics, StepMetrics.of(event, filtered), guard, limit)
        if signals:
            self._log("collapse guard: the run is collapsing", logging.WARNING, step=event.step,
                      signals="; ".join(signals))
        return dataclasses.replace(event, collapse_signals=signals)

    def _skip_step(self, origin: StepOrigin, step: int, group_ids: Sequence[str], reason: str,
                   duration_ms: float = 0.0) -> None:
        """Reports a step that trained nothing (see the module docstring): the scheduler re-plans it."""
        event = skipped_event(origin, step, self._trainer.version, group_ids, reason, duration_ms)
        self._producer.publish_sync(event)
        self.metrics.skipped(duration_ms / 1000)
        self._log("step skipped: nothing trainable, the scheduler plans it again", logging.WARNING, step=step,
                  assignment=origin.correlation_id, groups=",".join(event.dropped_group_ids), reason=reason)

    def _restore_last_checkpoint(self) -> None:
        """Weights and optimizer back to the last published version (the base model before the first)."""
        latest = ckpt.latest_checkpoint(self.config.checkpoint_root)
        if latest is None:
            self.trainer = Trainer(self.config.trainer_config())
        else:
            self._trainer.load_checkpoint(latest)
        self._log("weights restored after a refused step", logging.WARNING,
                  checkpoint=str(latest) if latest else "base model", version=self._trainer.version)


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
