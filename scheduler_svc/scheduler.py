"""The scheduler core: one event-sourced state machine over the pool, the rollout manager and the
streaming loader.

``handle(observation)`` applies the observation, reconciles (placement, weight sync, train trigger,
micro-batch feeding, resume, dispatch) and returns the decisions taken, each already applied. The
log (observations and decisions, in order) is the whole truth: ``Scheduler.from_log`` re-applies it
without deciding anything and yields a scheduler whose ``snapshot()`` equals the original's and which
answers the next observation identically.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from scheduler_svc.decisions import (
    OBSERVATION_TYPES,
    Assignment,
    Decision,
    Observation,
    Record,
    ResourceDown,
    ResourceLost,
    SampleCompleted,
    TaskAborted,
    Tick,
    TrainStepSkipped,
    WeightSyncStarted,
)
from scheduler_svc.errors import SchedulerError
from scheduler_svc.loader import GroupState, StreamingDataLoader
from scheduler_svc.policies import TagPolicy
from scheduler_svc.pool import ResourcePool
from scheduler_svc.rollout_manager import RolloutManager
from scheduler_svc.settings import SchedulerSettings
from scheduler_svc.tags import ROLLOUT, TRAIN, WEIGHT_SYNC
from scheduler_svc.tasks import Task

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        policy: TagPolicy,
        settings: SchedulerSettings,
        tasks: Sequence[Task],
        *,
        record_log: bool = True,
    ) -> None:
        self.policy = policy
        self.settings = settings
        self.pool = ResourcePool()
        self.loader = StreamingDataLoader(tasks, samples_per_task=settings.samples_per_task, epochs=settings.epochs)
        self.rollout = RolloutManager(self.pool, self.loader, policy, settings)
        self.record_log = record_log
        self.log: list[Record] = []
        self._out: list[Decision] = []
        self._placed_epoch = -1
        self._settled_epoch = -1

    # ---------------------------------------------------------------------------------- public API

    def handle(self, observation: Observation) -> list[Decision]:
        """Apply one observation and return the decisions it causes (already applied)."""
        if not isinstance(observation, OBSERVATION_TYPES):
            raise SchedulerError(f"handle() takes an observation, got {type(observation).__name__}")
        out: list[Decision] = []
        self._out = out
        skipped: list[str] = []
        if isinstance(observation, TrainStepSkipped) and self._is_running_step(observation.assignment_id):
            skipped = list(self.loader.by_assignment.get(observation.assignment_id, ()))
        self._record(observation)
        if isinstance(observation, ResourceDown):
            self._lose(observation.resource_id, observation.reason)
        elif isinstance(observation, Tick):
            for rid in self.pool.expired(observation.t, self.settings.heartbeat_timeout_s):
                self._lose(rid, "heartbeat_timeout")
            self._abort(self.loader.timed_out_groups(observation.t, self.settings.group_timeout_s), "group_timeout")
        elif isinstance(observation, TrainStepSkipped):
            self._abort([self.loader.groups[g] for g in skipped if g in self.loader.groups], "untrainable")
        elif isinstance(observation, SampleCompleted):
            for d in self.loader.plan_completion(observation.group_id):
                self._emit(d)
        self._reconcile()
        return out

    def apply(self, record: Record) -> None:
        """Replay one recorded observation or decision (no decisions are taken)."""
        self.pool.apply(record)
        self.loader.apply(record)
        self.rollout.apply(record)
        if self.record_log:
            self.log.append(record)

    def replay(self, log: Iterable[Record]) -> None:
        for record in log:
            self.apply(record)

    @classmethod
    def from_log(
        cls,
        policy: TagPolicy,
        settings: SchedulerSettings,
        tasks: Sequence[Task],
        log: Iterable[Record],
        *,
        record_log: bool = True,
    ) -> Scheduler:
        scheduler = cls(policy, settings, tasks, record_log=record_log)
        scheduler.replay(log)
        return scheduler

    def snapshot(self) -> dict[str, Any]:
        """Plain nested dict of the whole state; equal snapshots mean equal schedulers."""
        return {
            "pool": self.pool.snapshot(),
            "loader": self.loader.snapshot(),
            "rollout": self.rollout.snapshot(),
        }

    @property
    def version(self) -> int:
        return self.rollout.version

    # ---------------------------------------------------------------------------------- internals

    def _record(self, record: Record) -> None:
        self.apply(record)

    def _emit(self, decision: Decision) -> None:
        self.apply(decision)
        self._out.append(decision)
        if isinstance(decision, ResourceLost):
            log.warning(
                "resource lost",
                extra={"service": "scheduler", "resource": decision.resource_id, "cause": decision.cause},
            )
        elif isinstance(decision, Assignment) and decision.task_kind == TRAIN:
            log.info(
                "train step assigned",
                extra={
                    "service": "scheduler",
                    "step": decision.step,
                    "resources": len(decision.resource_ids),
                    "version": decision.policy_version,
                },
            )
        elif isinstance(decision, TaskAborted):
            log.info(
                "task aborted",
                extra={
                    "service": "scheduler",
                    "cause": decision.cause,
                    "group": decision.group_id,
                    "version": decision.policy_version,
                    "regenerate": decision.regenerate,
                },
            )
        elif isinstance(decision, WeightSyncStarted) and len(decision.resource_ids) > 1:
            log.info(
                "weight sync",
                extra={"service": "scheduler", "version": decision.version, "resources": len(decision.resource_ids)},
            )

    def _is_running_step(self, assignment_id: str) -> bool:
        return self.rollout.train is not None and self.rollout.train.assignment_id == assignment_id

    def _abort(self, groups: list[GroupState], cause: str) -> None:
        for d in self.loader.plan_abort(groups, cause, self.policy.max_regenerations):
            self._emit(d)

    def _lose(self, resource_id: str, cause: str) -> None:
        for d in self.pool.plan_loss(resource_id, cause):
            self._emit(d)

    def _reconcile(self) -> None:
        emit = self._emit
        if self.pool.structure_epoch != self._placed_epoch:
            self._place()
            self._placed_epoch = self.pool.structure_epoch
        self.rollout.start_weight_sync(emit)
        self.rollout.maybe_start_train(emit)
        self.rollout.feed_train(emit)
        if self.pool.structure_epoch != self._settled_epoch:
            self.rollout.settle(emit)
            self._settled_epoch = self.pool.structure_epoch
        self.rollout.lend_idle(emit)
        self.rollout.maybe_start_train(emit)  # trainers a verdict just kept idle start on the ready groups now
        self.rollout.feed_train(emit)
        self.rollout.finish_weight_syncs(emit)
        self.rollout.dispatch(emit)

    def _place(self) -> None:
        """Bring capability tags in line with the policy; a running SPMD step is never disturbed."""
        alive = self.pool.alive()
        desired = self.policy.place(alive)
        for r in alive:
            caps = desired.get(r.resource_id, frozenset())
            if caps == r.capabilities:
                continue
            current = None if r.assignment_id is None else self.pool.assignments[r.assignment_id]
            if current is not None and current.task_kind != ROLLOUT:
                continue
            cause = "placement"
            for d in self.pool.plan_capabilities(r.resource_id, caps, cause):
                self._emit(d)
            if ROLLOUT in caps:
                continue
            if current is not None:
                for d in self.pool.plan_preemption(current.assignment_id, cause="capability_change"):
                    self._emit(d)
            elif r.activity in (ROLLOUT, WEIGHT_SYNC):
                for d in self.pool.plan_activity(r.resource_id, "idle", "capability_change"):
                    self._emit(d)
