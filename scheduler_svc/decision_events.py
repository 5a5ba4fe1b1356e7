"""Decisions to bus events: the mapping listed in the `scheduler_svc.journal` module docstring.

Every event gets the next deterministic decision id and the time of the observation that caused
it, so the same journal always produces the same events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler_svc import decisions as core_decisions
from scheduler_svc.canonical import decision_event_id, histogram, ms
from scheduler_svc.errors import ReplayError
from scheduler_svc.scheduler import Scheduler
from schemas import events as ev
from schemas.payloads import AssignmentPayload, TaskPayload


class DecisionEvents:
    """The state the conversion reads and keeps: published weights, LoadWeights sent, dispatch and
    event counters, and the live groups' sample numbering and rewards (dropped when a group ends)."""

    core: Scheduler
    run_id: str
    producer: str
    model: str
    initial_weights_uri: str
    published: dict[int, tuple[str, str]]
    loads: dict[str, tuple[str, int]]
    samples: dict[str, dict[str, int]]
    rewards: dict[str, tuple[float, int]]
    event_seq: int
    dispatched: int

    def _meta(self, ts_ms: int, correlation_id: str) -> dict[str, Any]:
        event_id = decision_event_id(self.run_id, self.event_seq)
        self.event_seq += 1
        return {"event_id": event_id, "ts_ms": ts_ms, "producer": self.producer, "correlation_id": correlation_id}

    def _events(self, decisions: Sequence[core_decisions.Decision], t: float) -> list[ev.Event]:
        ts = ms(t)
        kinds = {d.assignment_id: d.task_kind for d in decisions if isinstance(d, core_decisions.Assignment)}
        out: list[ev.Event] = []
        for d in decisions:
            if isinstance(d, core_decisions.Preemption):
                for rid in d.resource_ids:
                    by = d.by_assignment_id or ""
                    out.append(ev.Preemption(**self._meta(ts, d.assignment_id), resource_id=rid,
                                             preempted_task=d.task_kind, by_task=kinds.get(by, ""),
                                             assignment_id=by, reason=d.cause))
            else:
                out.append(self._event(d, ts))
        return out

    def _event(self, d: core_decisions.Decision, ts: int) -> ev.Event:
        if isinstance(d, core_decisions.TagTransition):
            return ev.TagTransition(**self._meta(ts, d.resource_id), resource_id=d.resource_id,
                                    tag_kind=ev.TagKind(d.tag_kind), from_tags=d.from_tags, to_tags=d.to_tags,
                                    cause=d.cause, reason=d.reason)
        if isinstance(d, core_decisions.Assignment):
            return self._assignment(d, ts)
        if isinstance(d, core_decisions.ResourceLost):
            return ev.ResourceLost(**self._meta(ts, d.resource_id), resource_id=d.resource_id, reason=d.cause)
        if isinstance(d, core_decisions.PauseRollout):
            return ev.PauseRollout(**self._meta(ts, d.resource_id), resource_id=d.resource_id,
                                   mode=ev.PauseMode(d.mode), reason=d.cause)
        if isinstance(d, core_decisions.ResumeRollout):
            return ev.ResumeRollout(**self._meta(ts, d.resource_id), resource_id=d.resource_id, reason=d.cause)
        if isinstance(d, core_decisions.LoadWeights):
            uri, sha256 = self.published.get(d.version, (self.initial_weights_uri if d.version == 0 else "", ""))
            load = ev.LoadWeights(**self._meta(ts, d.sync_id), resource_id=d.resource_id, version=d.version,
                                  uri=uri, sha256=sha256)
            self.loads[d.resource_id] = (load.event_id, d.version)
            return load
        if isinstance(d, core_decisions.WeightSyncStarted):
            return ev.WeightSyncStarted(**self._meta(ts, d.sync_id), model=self.model, sync_id=d.sync_id,
                                        version=d.version, resource_ids=d.resource_ids)
        if isinstance(d, core_decisions.WeightSyncCompleted):
            return ev.WeightSyncCompleted(**self._meta(ts, d.sync_id), model=self.model, sync_id=d.sync_id,
                                          version=d.version, resource_ids=d.resource_ids)
        if isinstance(d, core_decisions.TrainData):
            return ev.TrainData(**self._meta(ts, d.assignment_id), run_id=self.run_id, assignment_id=d.assignment_id,
                                step=d.step, group_ids=d.group_ids, group_versions=d.group_versions,
                                staleness_histogram=histogram(d.token_lags), final=d.final)
        if isinstance(d, core_decisions.TaskDispatched):
            self.dispatched += 1
            return ev.TaskDispatched(**self._meta(ts, d.group_id), task_id=d.task_id, group_id=d.group_id,
                                     n_samples=d.n_samples, payload=TaskPayload(d.payload).to_json(),
                                     policy_version=d.policy_version, seq=self.dispatched - 1)
        if isinstance(d, core_decisions.TaskCompleted | core_decisions.TaskAborted):
            self.samples.pop(d.group_id, None)
            total, count = self.rewards.pop(d.group_id, (0.0, 0))
            aborted = "aborted" if isinstance(d, core_decisions.TaskAborted) and d.regenerate else "dropped"
            status = "completed" if isinstance(d, core_decisions.TaskCompleted) else aborted
            return ev.TaskCompleted(**self._meta(ts, d.group_id), task_id=d.task_id, group_id=d.group_id,
                                    num_samples=d.n_samples, mean_reward=total / count if count else 0.0,
                                    status=status)
        raise ReplayError(f"no event for decision {type(d).__name__}")  # pragma: no cover - Decision is closed

    def _assignment(self, d: core_decisions.Assignment, ts: int) -> ev.Assignment:
        version = d.policy_version
        if version is None:
            loaded = self.core.pool.get(d.resource_ids[0]).weights_version
            version = self.core.version if loaded is None else loaded
        payload = AssignmentPayload(cause=d.cause, work=d.work, run_id=self.run_id, reason=d.reason)
        return ev.Assignment(**self._meta(ts, d.assignment_id), assignment_id=d.assignment_id,
                             task_kind=d.task_kind, resource_ids=d.resource_ids,
                             step=-1 if d.step is None else d.step, policy_version=version,
                             payload=payload.to_json())
