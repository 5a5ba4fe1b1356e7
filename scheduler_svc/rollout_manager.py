"""Rollout manager: when rollout is interrupted and resumed, and how train batches are formed.

Interrupt triggers
  * sample threshold (B ready groups, or a first micro-batch) or batch timeout -> a train step; the
    train-tagged resources that were rolling out are preempted (``PauseRollout(abort)``);
  * a new policy version -> weight sync: every rolling-out resource pauses in place, loads the
    version, and all of them resume together once each one acknowledged (``WeightsLoaded``);
  * a tag transition that takes the rollout capability away (placement change, failure).
Resume triggers
  * a train step ends: train-tagged resources that also carry ``rollout`` load the new weights and
    go back to rollout;
  * a resource is added or recovers: it loads the current weights if it has others, then rolls out.

Staleness bound (``policy.max_staleness`` = eta, AReaL's max_head_offpolicyness). The lag of a group
is ``step - v`` where v is the policy version it was dispatched under and ``step`` the train step
that consumes it. Three rules keep every lag within [0, eta]:
  1. dispatch budget: a new group can be consumed at the earliest by the running step (if it still
     takes data) or the next one, and must be consumed by step v + eta; the loader may keep at most
     as many unconsumed groups outstanding as those steps will take (AReaL's
     ``(eta + version + 1) * B`` generalised to streaming steps);
  2. the batch of step s takes first every group with ``v <= s - eta`` (the last step allowed to
     consume it), then the oldest other ready groups;
  3. step s only closes its batch once no group with ``v <= s - eta`` is still rolling out.
Rules 2 and 3 alone guarantee the bound whatever order samples finish in; rule 1 keeps the trainer
from waiting on an unbounded backlog.

All planning methods read state and hand decisions to ``emit``, which applies each one before the
next is planned; state changes only through ``apply``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler_svc.decisions import (
    OBSERVATION_TYPES,
    Assignment,
    Decision,
    LoadWeights,
    PauseRollout,
    Preemption,
    Record,
    ResourceLost,
    ResumeRollout,
    TagTransition,
    TrainData,
    TrainStepCompleted,
    WeightsLoaded,
    WeightSyncCompleted,
    WeightSyncStarted,
)
from scheduler_svc.loader import StreamingDataLoader
from scheduler_svc.policies import TagPolicy
from scheduler_svc.pool import ResourcePool
from scheduler_svc.settings import SchedulerSettings
from scheduler_svc.tags import ACTIVITY, IDLE, OFFLINE, ROLLOUT, TRAIN, WEIGHT_SYNC

Emit = Callable[[Decision], None]


@dataclass
class TrainState:
    assignment_id: str
    step: int
    resource_ids: tuple[str, ...]
    fed: int = 0
    final: bool = False
    lags: list[int] = field(default_factory=list)

    def snapshot(self) -> dict[str, Any]:
        return {
            "assignment_id": self.assignment_id,
            "step": self.step,
            "resource_ids": self.resource_ids,
            "fed": self.fed,
            "final": self.final,
            "lags": tuple(self.lags),
        }


@dataclass
class SyncState:
    version: int
    members: list[str] = field(default_factory=list)
    pending: set[str] = field(default_factory=set)

    def snapshot(self) -> dict[str, Any]:
        return {"version": self.version, "members": tuple(self.members), "pending": tuple(sorted(self.pending))}


class RolloutManager:
    def __init__(
        self, pool: ResourcePool, loader: StreamingDataLoader, policy: TagPolicy, settings: SchedulerSettings
    ) -> None:
        self.pool = pool
        self.loader = loader
        self.policy = policy
        self.settings = settings
        self.version = 0  # latest policy version published by the trainer
        self.serving_version = 0  # latest version a fleet-wide weight sync was started for
        self.train: TrainState | None = None
        self.syncs: dict[str, SyncState] = {}
        self.resource_sync: dict[str, str] = {}
        self.next_sync_seq = 0
        self.now = 0.0
        self.idle_since: float | None = None  # when the trainer last became free (batch timeout)
        self.steps_completed = 0
        self.lag_histogram: Counter[int] = Counter()  # lag -> groups trained on
        self._cache_epoch = -1
        self._trainers: tuple[str, ...] = ()

    # ---------------------------------------------------------------------------------- queries

    @property
    def microbatch_groups(self) -> int:
        return math.ceil(self.settings.train_batch_groups / self.policy.train_microbatches)

    def trainers(self) -> tuple[str, ...]:
        """Alive train-tagged resources: the SPMD set of the next train step."""
        if self._cache_epoch != self.pool.structure_epoch:
            self._trainers = tuple(r.resource_id for r in self.pool.with_capability(TRAIN))
            self._cache_epoch = self.pool.structure_epoch
        return self._trainers

    def serving_resources(self) -> int:
        """Rollout resources serving or about to serve (paused for weights) requests."""
        return self.pool.serving_count

    def dispatch_budget(self) -> int:
        """Groups the loader may still dispatch without breaking the staleness bound (rule 1)."""
        b = self.settings.train_batch_groups
        eta = self.policy.max_staleness
        if self.train is None:
            still_needed, later_steps = 0, eta + 1
        else:
            still_needed = 0 if self.train.final else max(0, b - self.train.fed)
            later_steps = eta
        return still_needed + later_steps * b - self.loader.unassigned_outstanding

    def _new_sync_id(self) -> str:
        return f"sync{self.next_sync_seq}"

    # ---------------------------------------------------------------------------------- planners

    def start_weight_sync(self, emit: Emit) -> None:
        """A new version exists: pause every rolling-out resource in place and load it."""
        if self.version <= self.serving_version:
            return
        members = [
            r
            for r in self.pool.resources.values()
            if r.alive and ROLLOUT in r.capabilities and r.activity in (ROLLOUT, WEIGHT_SYNC)
        ]
        sync_id = self._new_sync_id()
        emit(WeightSyncStarted(sync_id, self.version, tuple(r.resource_id for r in members)))
        for r in members:
            if r.activity == ROLLOUT:
                emit(PauseRollout(r.resource_id, "in_place", "weight_sync"))
                emit(TagTransition(r.resource_id, ACTIVITY, (ROLLOUT,), (WEIGHT_SYNC,), "weight_sync"))
            emit(LoadWeights(r.resource_id, self.version, sync_id, "weight_sync"))

    def _next_chunk(self, step: int, fed: int) -> tuple[list[str], list[int], bool] | None:
        """Groups to hand to step `step` now, and whether they close its batch (rules 2 and 3)."""
        b = self.settings.train_batch_groups
        limit = step - self.policy.max_staleness
        loader = self.loader
        must_inflight = loader.inflight_unassigned_at_or_below(limit) if self.policy.strict_staleness else 0
        must_ready = loader.ready_at_or_below(limit)
        room = max(0, b - fed - must_ready - must_inflight)
        count = must_ready + min(len(loader.ready) - must_ready, room)
        drained = loader.exhausted() and loader.inflight_unassigned_total == 0
        closes = must_inflight == 0 and fed + count >= b
        timed_out = (
            fed == 0
            and self.settings.batch_timeout_s is not None
            and self.idle_since is not None
            and self.now - self.idle_since >= self.settings.batch_timeout_s
            and must_inflight == 0
            and count >= self.settings.min_groups_on_timeout
        )
        if closes or timed_out or drained:
            if count == 0 and fed == 0:
                return None
            final = True
        elif self.policy.train_microbatches > 1 and count >= self.microbatch_groups:
            final = False
        else:
            return None
        chosen = loader.ready_sorted()[:count]
        return [g.group_id for g in chosen], [g.policy_version for g in chosen], final

    def maybe_start_train(self, emit: Emit) -> None:
        if self.train is not None:
            return
        trainers = self.trainers()
        if not trainers:
            return
        step = self.version
        chunk = self._next_chunk(step, 0)
        if chunk is None:
            return
        group_ids, versions, final = chunk
        assignment_id = self.pool.next_assignment_id()
        for d in self.pool.plan_assignment(TRAIN, trainers, cause="train_step", step=step, policy_version=step):
            emit(d)
        emit(TrainData(assignment_id, step, tuple(group_ids), tuple(versions), final))

    def feed_train(self, emit: Emit) -> None:
        """Stream further micro-batches into the running step."""
        t = self.train
        if t is None or t.final:
            return
        chunk = self._next_chunk(t.step, t.fed)
        if chunk is None:
            return
        group_ids, versions, final = chunk
        emit(TrainData(t.assignment_id, t.step, tuple(group_ids), tuple(versions), final))

    def settle(self, emit: Emit) -> None:
        """Put free resources to work: rollout-tagged ones roll out (after loading current weights),
        the others wait idle. This is the resume trigger for step ends, joins and recoveries."""
        for r in list(self.pool.resources.values()):
            if not r.alive or r.assignment_id is not None or r.activity in (WEIGHT_SYNC, OFFLINE):
                continue
            cause = "resource_added" if r.activity == IDLE else "train_step_done"
            if ROLLOUT in r.capabilities:
                if r.weights_version == self.version:
                    for d in self.pool.plan_assignment(ROLLOUT, [r.resource_id], cause=cause):
                        emit(d)
                    emit(ResumeRollout(r.resource_id, self.version, cause))
                else:
                    sync_id = self._new_sync_id()
                    emit(WeightSyncStarted(sync_id, self.version, (r.resource_id,)))
                    emit(TagTransition(r.resource_id, ACTIVITY, (r.activity,), (WEIGHT_SYNC,), cause))
                    emit(LoadWeights(r.resource_id, self.version, sync_id, cause))
            elif r.activity != IDLE:
                emit(TagTransition(r.resource_id, ACTIVITY, (r.activity,), (IDLE,), cause))

    def finish_weight_syncs(self, emit: Emit) -> None:
        """Resume the members of every sync group whose loads were all acknowledged."""
        for sync_id, sync in list(self.syncs.items()):
            if sync.pending or not sync.members:
                continue
            members = tuple(sync.members)
            emit(WeightSyncCompleted(sync_id, sync.version, members))
            for rid in members:
                r = self.pool.get(rid)
                if not r.alive or r.activity != WEIGHT_SYNC:
                    continue
                if r.assignment_id is None:
                    for d in self.pool.plan_assignment(ROLLOUT, [rid], cause="weights_loaded"):
                        emit(d)
                else:
                    emit(TagTransition(rid, ACTIVITY, (WEIGHT_SYNC,), (ROLLOUT,), "weights_loaded"))
                emit(ResumeRollout(rid, sync.version, "weights_loaded"))

    def dispatch(self, emit: Emit) -> None:
        """Hand out tasks while rollout capacity and the staleness budget allow."""
        if self.loader.exhausted():
            return
        budget = self.dispatch_budget()
        if budget <= 0:
            return
        slots = self.serving_resources() * self.settings.max_inflight_samples_per_resource
        free_groups = (slots - self.loader.inflight_samples) // self.settings.samples_per_task
        for d in self.loader.plan_dispatch(min(budget, free_groups), self.version):
            emit(d)

    # ---------------------------------------------------------------------------------- evolve

    def apply(self, record: Record) -> None:
        if isinstance(record, OBSERVATION_TYPES):
            t = record.t  # type: ignore[union-attr]
            self.now = max(self.now, t)
            if self.idle_since is None:
                self.idle_since = t
        handler = _APPLY.get(type(record))
        if handler is not None:
            handler(self, record)

    def _leave_sync(self, resource_id: str) -> None:
        sync_id = self.resource_sync.pop(resource_id, None)
        if sync_id is None:
            return
        sync = self.syncs.get(sync_id)
        if sync is None:
            return
        if resource_id in sync.members:
            sync.members.remove(resource_id)
        sync.pending.discard(resource_id)
        if not sync.members:
            del self.syncs[sync_id]

    def _apply_assignment(self, d: Assignment) -> None:
        if d.task_kind == TRAIN:
            self.train = TrainState(d.assignment_id, d.step if d.step is not None else self.version, d.resource_ids)

    def _apply_train_data(self, d: TrainData) -> None:
        t = self.train
        if t is None or t.assignment_id != d.assignment_id:
            return
        t.fed += len(d.group_ids)
        t.final = t.final or d.final
        t.lags.extend(d.step - v for v in d.group_versions)

    def _apply_preemption(self, d: Preemption) -> None:
        if self.train is not None and self.train.assignment_id == d.assignment_id:
            self.train = None

    def _apply_step_completed(self, obs: TrainStepCompleted) -> None:
        t = self.train
        if t is None or t.assignment_id != obs.assignment_id:
            return  # a stale or duplicated report (the step was preempted or already counted)
        self.version = max(self.version, obs.version)
        self.lag_histogram.update(t.lags)
        self.steps_completed += 1
        self.train = None
        self.idle_since = obs.t

    def _apply_sync_started(self, d: WeightSyncStarted) -> None:
        self.next_sync_seq += 1
        self.serving_version = max(self.serving_version, d.version)
        if d.resource_ids:
            self.syncs[d.sync_id] = SyncState(d.version)

    def _apply_load(self, d: LoadWeights) -> None:
        if self.resource_sync.get(d.resource_id) != d.sync_id:
            self._leave_sync(d.resource_id)
        sync = self.syncs.setdefault(d.sync_id, SyncState(d.version))
        if d.resource_id not in sync.members:
            sync.members.append(d.resource_id)
        sync.pending.add(d.resource_id)
        self.resource_sync[d.resource_id] = d.sync_id

    def _apply_loaded(self, obs: WeightsLoaded) -> None:
        sync_id = self.resource_sync.get(obs.resource_id)
        if sync_id is None:
            return
        sync = self.syncs.get(sync_id)
        if sync is not None and sync.version == obs.version:
            sync.pending.discard(obs.resource_id)

    def _apply_sync_completed(self, d: WeightSyncCompleted) -> None:
        self.syncs.pop(d.sync_id, None)
        for rid in d.resource_ids:
            if self.resource_sync.get(rid) == d.sync_id:
                del self.resource_sync[rid]

    def _apply_tag(self, d: TagTransition) -> None:
        if d.tag_kind == ACTIVITY and d.from_tags == (WEIGHT_SYNC,):
            self._leave_sync(d.resource_id)

    def _apply_resume(self, d: ResumeRollout) -> None:
        self._leave_sync(d.resource_id)

    def _apply_lost(self, d: ResourceLost) -> None:
        self._leave_sync(d.resource_id)

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "serving_version": self.serving_version,
            "train": None if self.train is None else self.train.snapshot(),
            "syncs": {sid: s.snapshot() for sid, s in self.syncs.items()},
            "resource_sync": dict(sorted(self.resource_sync.items())),
            "next_sync_seq": self.next_sync_seq,
            "now": self.now,
            "idle_since": self.idle_since,
            "steps_completed": self.steps_completed,
            "lag_histogram": dict(sorted(self.lag_histogram.items())),
        }


_APPLY: dict[type, Any] = {
    Assignment: RolloutManager._apply_assignment,
    TrainData: RolloutManager._apply_train_data,
    Preemption: RolloutManager._apply_preemption,
    TrainStepCompleted: RolloutManager._apply_step_completed,
    WeightSyncStarted: RolloutManager._apply_sync_started,
    LoadWeights: RolloutManager._apply_load,
    WeightsLoaded: RolloutManager._apply_loaded,
    WeightSyncCompleted: RolloutManager._apply_sync_completed,
    TagTransition: RolloutManager._apply_tag,
    ResumeRollout: RolloutManager._apply_resume,
    ResourceLost: RolloutManager._apply_lost,
}
