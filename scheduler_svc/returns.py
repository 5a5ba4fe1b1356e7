"""Where a free resource goes: back to rollout (loading the current weights first if it has others),
idle, or, for an adaptive policy's train-capable resource, held for the next train step when lending
it would cost more than it brings (`scheduler_svc.lending`). The resume half of the rollout manager."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from scheduler_svc.arrivals import arrival_s, arrivals_within
from scheduler_svc.decisions import (
    Assignment,
    Decision,
    LoadWeights,
    Record,
    ResumeRollout,
    TagTransition,
    WeightSyncStarted,
)
from scheduler_svc.estimates import Estimates
from scheduler_svc.lending import (
    LEND_DECLINED,
    Reprefill,
    Verdict,
    lend_value_share,
    lend_verdict,
    runs_no_faster,
    start_verdict,
    take_count,
    train_bound,
)
from scheduler_svc.loader import StreamingDataLoader
from scheduler_svc.policies import StragglerRule, TagPolicy
from scheduler_svc.pool import ResourcePool
from scheduler_svc.roofline import DeviceSpec
from scheduler_svc.settings import SchedulerSettings
from scheduler_svc.tags import ACTIVITY, IDLE, OFFLINE, ROLLOUT, TRAIN, WEIGHT_SYNC
from scheduler_svc.weight_syncs import WeightSyncLedger

Emit = Callable[[Decision], None]


class ReturnPlanner(ABC):
    """The base of RolloutManager, whose state it reads (declared here; the queries below are the
    manager's, abstract here)."""

    pool: ResourcePool
    loader: StreamingDataLoader
    policy: TagPolicy
    settings: SchedulerSettings
    version: int
    weight_syncs: WeightSyncLedger
    estimates: Estimates
    held: set[str]
    now: float

    @property
    @abstractmethod
    def batch_groups(self) -> int:
        """See RolloutManager."""

    @property
    @abstractmethod
    def microbatch_groups(self) -> int:
        """See RolloutManager."""

    @property
    @abstractmethod
    def train_fed(self) -> int | None:
        """See RolloutManager."""

    @property
    @abstractmethod
    def step_resources(self) -> tuple[str, ...] | None:
        """See RolloutManager."""

    @abstractmethod
    def dispatch_budget(self) -> int:
        """See RolloutManager."""

    @abstractmethod
    def trainers(self) -> tuple[str, ...]:
        """See RolloutManager."""

    def settle(self, emit: Emit) -> None:
        """Put free resources to work: rollout-tagged ones roll out (after loading current weights),
        the others wait idle. This is the resume trigger for step ends, joins and recoveries."""
        for r in list(self.pool.resources.values()):
            if not r.alive or r.assignment_id is not None or r.activity in (WEIGHT_SYNC, OFFLINE):
                continue
            if r.resource_id in self.held and TRAIN in r.capabilities:
                continue  # lend_idle decides when it goes back to rollout
            cause = "resource_added" if r.activity == IDLE else "train_step_done"
            if ROLLOUT in r.capabilities:
                # a joining trainer is weighed only before any estimate (the first step's rule)
                weigh = cause == "train_step_done" or self.estimates.tokens_per_resource_s is None
                verdict = self._lend_verdict() if weigh and TRAIN in r.capabilities else None
                if verdict is not None and not verdict.take:
                    emit(TagTransition(r.resource_id, ACTIVITY, (r.activity,), (IDLE,), LEND_DECLINED, verdict.reason))
                    continue
                self._to_rollout(emit, r.resource_id, cause, "" if verdict is None else verdict.reason)
            elif r.activity != IDLE:
                emit(TagTransition(r.resource_id, ACTIVITY, (r.activity,), (IDLE,), cause))

    def _to_rollout(self, emit: Emit, resource_id: str, cause: str, reason: str) -> None:
        r = self.pool.get(resource_id)
        if r.weights_version == self.version:
            for d in self.pool.plan_assignment(ROLLOUT, [resource_id], cause=cause, reason=reason):
                emit(d)
            emit(ResumeRollout(resource_id, self.version, cause))
        else:
            sync_id = self.weight_syncs.new_sync_id()
            emit(WeightSyncStarted(sync_id, self.version, (resource_id,)))
            emit(TagTransition(resource_id, ACTIVITY, (r.activity,), (WEIGHT_SYNC,), cause, reason))
            emit(LoadWeights(resource_id, self.version, sync_id, cause))

    def _lend_verdict(self) -> Verdict | None:
        """Whether a train-capable resource free now (from a step, or kept for training) should be lent
        to rollout (adaptive policies); judged train bound by the held share (the train-bound test's
        hysteresis, `scheduler_svc.lending.TRAIN_BOUND_HOLD_SHARE`)."""
        if not self.policy.adaptive:
            return None
        ready = len(self.loader.ready)
        fed = self.train_fed or 0
        ages, barrier = self._rolling_out_ages()
        capable = len(self.trainers())
        held = self._reprefill()
        bound = train_bound(self.estimates, capable=capable, batch_groups=self.batch_groups, holding=True)
        verdict = lend_verdict(
            self.estimates,
            starts_on_first=bound.take,
            missing_first=self.microbatch_groups - ready - fed,
            missing_all=self.batch_groups - ready - fed,
            ready=ready + fed,
            resources=capable,
            switch_s=self.settings.switch_estimate_s,
            held=held,
            value_share=self._value_share(1.0 if held is None else held.decode_ratio),
            first_s=arrival_s(self.estimates.latencies, ages, self.microbatch_groups - ready - fed),
            rest_s=arrival_s(self.estimates.latencies, ages, self.batch_groups - ready - fed, barrier),
            arrived=arrivals_within(self.estimates.latencies, ages, self.batch_groups - ready - fed),
        )
        return verdict if verdict.benefit_s is not None else self._unestimated_lend_verdict()

    def _unestimated_lend_verdict(self) -> Verdict:
        """The lend bet before there are estimates to price it (the first step): taken, as by the
        fixed policy, unless the device specs alone say it loses: budget bound (the lent resource
        gets no work of its own, only the running requests spread onto it) on a resource that
        decodes slower than the serving ones, where what it takes becomes the batch's stragglers
        (`scheduler_svc.lending.runs_no_faster`, nothing has run: no KV share yet). Measured: A100
        trainers among H20s lent before the first step left the run 2.7 % below the fixed split
        after 20 steps, never lending or not."""
        ratio = self._decode_ratio()
        if ratio is None or self._slot_bound() or not runs_no_faster(ratio, 0.0):
            return Verdict(True, None, None, "lend")
        return Verdict(False, None, None, f"lend (budget bound, the lent resource decodes {ratio:.2f}x slower)")

    def _rolling_out_ages(self) -> tuple[list[float], list[float]]:
        """How long each group not fed to a step has been rolling out, and the same for the groups
        the next step's batch must wait for (strict bound, wait rule: dispatched at or below its
        last allowed version)."""
        now = self.now
        limit = self.version - self.policy.max_staleness
        waits = self.policy.strict_staleness and self.policy.straggler == StragglerRule.WAIT
        ages, barrier = [], []
        for g in self.loader.groups.values():
            if g.completed or g.assignment_id is not None:
                continue
            ages.append(now - g.dispatched_at)
            if waits and g.policy_version <= limit:
                barrier.append(now - g.dispatched_at)
        return ages, barrier

    def _value_share(self, decode_ratio: float) -> float:
        """What a lent resource's rollout is worth (`scheduler_svc.lending.lend_value_share`): slot
        bound when the staleness budget would dispatch more samples than the serving resources have
        free slots for (the lent one gets its share of new work), else budget bound."""
        return lend_value_share(
            self.estimates,
            slot_bound=self._slot_bound(),
            serving=self.pool.serving_count,
            alive=len(self.pool.alive()),
            kv_balance_tokens=self.settings.kv_balance_tokens,
            decode_ratio=decode_ratio,
        )

    def _slot_bound(self) -> bool:
        """Would the staleness budget dispatch more samples than the serving resources have free slots for?"""
        free = self.pool.serving_count * self.settings.max_inflight_samples_per_resource - self.loader.inflight_samples
        return self.dispatch_budget() * self.settings.samples_per_task > free

    def _devices(self) -> tuple[list[DeviceSpec], list[DeviceSpec]]:
        """The train-capable resources' devices and the rollout-only ones' (the trainers themselves in
        a pool without rollout-only resources); both empty without trainers."""
        trainers = [self.pool.get(rid).device for rid in self.trainers()]
        others = [r.device for r in self.pool.resources.values() if r.alive and TRAIN not in r.capabilities]
        return trainers, (others or trainers)

    def _decode_ratio(self) -> float | None:
        """The rollout-only resources' HBM bandwidth over the train-capable ones' (their decode speed
        relative to a lent trainer's); None without trainers."""
        trainers, others = self._devices()
        return _decode_ratio(trainers, others) if trainers else None

    def _reprefill(self) -> Reprefill | None:
        """What a lent trainer's requests would cost to re-prefill on the rollout resources: as many
        as a serving resource holds now (at most the per-resource cap), each a mean sample long, on
        the rollout-only resources (the trainers themselves in a pool without any)."""
        est = self.estimates
        trainers, others = self._devices()
        if est.group_tokens is None or not trainers:
            return None
        cap = self.settings.max_inflight_samples_per_resource
        sequences = min(cap, self.loader.inflight_samples / max(1, self.pool.serving_count))
        return Reprefill(
            sequences=sequences,
            sample_tokens=est.group_tokens / self.settings.samples_per_task,
            peak_ratio=_mean([d.peak_tflops for d in trainers]) / _mean([d.peak_tflops for d in others]),
            decode_ratio=_decode_ratio(trainers, others),
        )

    def _take(self, trainers: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
        """The train-capable resources the next step takes (adaptive policies, see
        `scheduler_svc.lending.take_count`): best `train_priority` first, and among equals the ones
        not rolling out (taking them preempts nothing)."""
        n, reason = take_count(self.estimates, capable=len(trainers), batch_groups=self.settings.train_batch_groups)
        ranked = sorted(
            (self.pool.get(rid) for rid in trainers),
            key=lambda r: (-r.train_priority, r.activity == ROLLOUT, r.registered_seq),
        )
        return tuple(r.resource_id for r in ranked[:n]), reason

    def _start_verdict(self, trainers: tuple[str, ...], capable: int, ready: int, ready_tokens: int) -> Verdict:
        """Start a step on a partial batch (`ready` groups) now? At once when training is the
        bottleneck; idle trainers unless lending them pays; rolling-out ones when the stragglers'
        rest is hidden by the training of the ready groups (see `scheduler_svc.lending`)."""
        bound = train_bound(self.estimates, capable=capable, batch_groups=self.settings.train_batch_groups)
        if bound.take:
            return bound
        if all(self.pool.get(rid).activity == IDLE for rid in trainers):
            lend = self._lend_verdict()
            if lend is None or lend.benefit_s is None:
                return Verdict(True, None, None, "start idle trainers")
            return Verdict(not lend.take, lend.benefit_s, lend.cost_s, "start idle trainers (lend window vs cost)")
        ages, barrier = self._rolling_out_ages()
        return start_verdict(
            self.estimates,
            rest_s=arrival_s(self.estimates.latencies, ages, self.batch_groups - ready, barrier),
            missing=self.batch_groups - ready,
            ready_tokens=ready_tokens,
            resources=len(trainers),
            switch_s=self.settings.switch_estimate_s,
        )

    def lend_idle(self, emit: Emit) -> None:
        """Re-examine the resources kept for training: lend one once the wait turns out to pay, or
        as soon as a step started without it (it would wait out the whole step)."""
        if not self.held:
            return
        running = self.step_resources
        if running is None:
            verdict = self._lend_verdict()
            if verdict is None or not verdict.take:
                return
            reason = verdict.reason
        else:
            reason = f"lend: not taken by the running step ({len(running)} train)"
        for rid in sorted(self.held):
            r = self.pool.get(rid)
            if r.alive and r.assignment_id is None and r.activity == IDLE and ROLLOUT in r.capabilities:
                self._to_rollout(emit, rid, "lend", reason)

    def _track_held(self, record: Record) -> None:
        if isinstance(record, TagTransition) and record.tag_kind == ACTIVITY:
            if record.cause == LEND_DECLINED:
                self.held.add(record.resource_id)
            else:
                self.held.discard(record.resource_id)
        elif isinstance(record, Assignment):
            self.held.difference_update(record.resource_ids)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _decode_ratio(trainers: list[DeviceSpec], others: list[DeviceSpec]) -> float:
    return _mean([d.hbm_tb_per_s for d in others]) / _mean([d.hbm_tb_per_s for d in trainers])
