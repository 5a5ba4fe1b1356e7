"""The deterministic half of the scheduler service: bus events in, journal records and events out.

`JournaledScheduler` wraps the core `Scheduler` with the little state the shell needs (published
weight versions, sample numbering per group, outstanding LoadWeights commands, journal positions)
and does everything that decides something, without Kafka:

    input_of(event)            the compact facts of a consumed event (None: not an input)
    observe(input, source)     derive core observations from the facts, `handle` them, turn every
                               decision into bus events; returns a `Step`: the SchedulerObserved
                               journal record and the decision events, in order
    replay(record)             the same for a recorded journal entry (rebuild), checked against it
    checkpoint(with_state)     a SchedulerCheckpoint (decision config, counters, optionally the state)

The pieces live by concern: the facts of each event in `inputs` (`EventInputs.input_of`), decisions
to events in `decision_events`, ids and canonical JSON in `canonical`; this module derives the core
observations and keeps the journal's order.

Everything it produces is a function of the journal alone: decision events carry deterministic ids
(`decision_event_id(run_id, n)` for the n-th decision event of the run) and their `ts_ms` is the time
of the observation that caused them, so rebuilding from the journal re-creates byte-identical events
and a re-published copy is recognisable as a duplicate by its id.

Observations from events (t = the event's ts_ms / 1000):
    ResourceRegistered  -> ResourceRegistered(device from the event's numbers, else the kind's preset;
                           loaded_version 0: engines start from the initial weights)
    Heartbeat           -> Heartbeat (only when it advances the recorded one by `coalesce_s`)
    ResourceLost        -> ResourceDown(reason)        (not the scheduler's own ResourceLost)
    Trajectory          -> SampleCompleted(group, next sample index, generated tokens by policy version
                           from its nodes' loss mask and per-token versions); its reward is kept
    BatchReady          -> SampleCompleted for every sample of the group not reported yet
    TrainStepCompleted  -> TrainStepCompleted(assignment of the running step, step, new_version, groups
    + WeightsPublished     filtered, groups added by dynamic sampling), held until the version's
                           WeightsPublished (its uri and sha256) is known
    TrainStepCompleted  -> TrainStepSkipped(assignment, step, reason) at once (no weights to wait for),
      status 'skipped'     only for the running step's own assignment id (a restarted trainer's repeat
                           of an older skip must not end the step planned in its place)
    WeightsLoaded       -> WeightsLoaded (a second report of the same load is dropped)
    ControlAck          -> of the resource's latest LoadWeights (command_id = its event id): ok ->
                           WeightsLoaded; failed -> ResourceDown(load_weights_failed)
    clock tick          -> Tick (only when a heartbeat, batch or group timeout may fire)
Decisions to events (each with `cause` where the event has a field for it):
    TagTransition -> TagTransition(cause)      Assignment -> Assignment(payload {cause, work, run_id})
    Preemption    -> one Preemption per member (assignment_id = the preempting assignment or '',
                     correlation_id = the preempted one, reason = cause)
    ResourceLost  -> ResourceLost(reason = cause)   PauseRollout / ResumeRollout -> same (reason = cause)
    LoadWeights   -> LoadWeights(uri, sha256 of the version; correlation_id = sync id)
    WeightSyncStarted / WeightSyncCompleted -> same events (topic weights)
    TrainData     -> TrainData(staleness_histogram from token_lags) (topic train)
    TaskDispatched -> TaskDispatched(payload as JSON, seq = dispatch counter)
    TaskCompleted -> TaskCompleted(mean reward of its Trajectory events, status 'completed')
    TaskAborted   -> TaskCompleted(status 'aborted' when re-generated, else 'dropped')
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_svc import decisions as core
from scheduler_svc.canonical import canonical_json, journal_event_id, ms, observation_json
from scheduler_svc.decision_events import DecisionEvents
from scheduler_svc.errors import ReplayError
from scheduler_svc.inputs import TICK, EventInputs
from scheduler_svc.pool import Resource
from scheduler_svc.roofline import DeviceSpec
from scheduler_svc.scheduler import Scheduler
from schemas import events as ev

log = logging.getLogger(__name__)

#: what an input derives: the core observations, and whether it changed the shell's own state
Derived = tuple[list[core.Observation], bool]


@dataclass(frozen=True)
class Source:
    """Where an input was read: catalog topic, partition, offset (a tick has none)."""

    topic: str = ""
    partition: int = -1
    offset: int = -1

    @property
    def key(self) -> str:
        return f"{self.topic}:{self.partition}"


@dataclass(frozen=True)
class PendingStep:
    """A train step's report, held until its weights are published (WeightsPublished)."""

    step: int
    assignment_id: str
    filtered: int = 0
    added_group_ids: tuple[str, ...] = ()

    def state(self) -> list[Any]:
        """As the journal's state holds it (the dynamic-sampling part only when set, as before it existed)."""
        dynamic = [self.filtered, list(self.added_group_ids)] if self.filtered or self.added_group_ids else []
        return [self.step, self.assignment_id, *dynamic]


@dataclass(frozen=True)
class Step:
    """One journaled input: its record and the decision events it caused, in decision order."""

    record: ev.SchedulerObserved
    events: tuple[ev.Event, ...]


class JournaledScheduler(EventInputs, DecisionEvents):
    """The core plus the shell's own state; every change goes through `observe` (or `replay`)."""

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        run_id: str,
        producer: str,
        model: str = "",
        initial_weights_uri: str = "",
        coalesce_s: float = 0.0,
        decision_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.core = scheduler
        self.run_id = run_id
        self.producer = producer
        self.model = model
        self.initial_weights_uri = initial_weights_uri
        self.coalesce_s = coalesce_s
        self.decision_config = dict(decision_config or {})
        self.published: dict[int, tuple[str, str]] = {}  # version -> (uri, sha256)
        self.pending_steps: dict[int, PendingStep] = {}  # new version -> the step's report
        self.samples: dict[str, dict[str, int]] = {}  # live group -> {trajectory id: sample index}
        self.rewards: dict[str, tuple[float, int]] = {}  # live group -> (reward sum, rewards counted)
        self.loads: dict[str, tuple[str, int]] = {}  # resource -> (LoadWeights event id, version)
        self.positions: dict[str, int] = {}  # "topic:partition" -> offset of the last journaled input
        self.observed_seq = 0
        self.event_seq = 0
        self.dispatched = 0  # TaskDispatched events so far (their dense `seq`)

    # ---------------------------------------------------------------------------------- inputs

    def seen(self, source: Source) -> bool:
        """Whether an input at or after `source` in its partition is already in the journal."""
        return source.offset <= self.positions.get(source.key, -1)

    def should_tick(self, t: float) -> bool:
        """Whether a Tick at `t` can fire a timeout (ticks that cannot are not journaled)."""
        s = self.core.settings
        if self.core.pool.expired(t, s.heartbeat_timeout_s):
            return True
        if self.core.loader.timed_out_groups(t, s.group_timeout_s):
            return True
        r = self.core.rollout
        return (
            s.batch_timeout_s is not None
            and r.train is None
            and r.idle_since is not None
            and t - r.idle_since >= s.batch_timeout_s
            and len(self.core.loader.ready) >= s.min_groups_on_timeout
        )

    # ---------------------------------------------------------------------------------- stepping

    def observe(self, facts: Mapping[str, Any], source: Source = Source(), ts_ms: int | None = None) -> Step | None:
        """Derive, handle and convert one input; None when it changes nothing (it is not journaled)."""
        text = canonical_json(facts)
        facts = json.loads(text)  # exactly what a replay of the record will see
        observations, changed = self._derive(facts)
        if not observations and not changed:
            return None
        first_event = self.event_seq
        events: list[ev.Event] = []
        for observation in observations:
            events.extend(self._events(self.core.handle(observation), observation.t))
        record = ev.SchedulerObserved(
            event_id=journal_event_id(self.run_id, self.observed_seq),
            ts_ms=ms(float(facts["t"])) if ts_ms is None else ts_ms,
            producer=self.producer,
            correlation_id=self.run_id,
            run_id=self.run_id,
            seq=self.observed_seq,
            source_topic=source.topic,
            source_partition=source.partition,
            source_offset=source.offset,
            input=text,
            observations=canonical_json([observation_json(o) for o in observations]),
            event_seq=first_event,
            num_events=len(events),
        )
        self.observed_seq += 1
        if source.topic:
            self.positions[source.key] = max(source.offset, self.positions.get(source.key, -1))
        return Step(record, tuple(events))

    def replay(self, record: ev.SchedulerObserved) -> Step:
        """Re-apply a journal record; raises `ReplayError` if it does not fit this state and code."""
        if record.run_id != self.run_id:
            raise ReplayError(f"journal record of run {record.run_id!r} replayed into run {self.run_id!r}")
        if record.seq != self.observed_seq:
            raise ReplayError(f"journal record {record.seq} replayed after {self.observed_seq} records")
        source = Source(record.source_topic, record.source_partition, record.source_offset)
        step = self.observe(json.loads(record.input), source, record.ts_ms)
        if step is None:
            raise ReplayError(f"journal record {record.seq} ({record.input[:80]}) changes nothing on replay")
        mine = step.record
        if (mine.observations, mine.event_seq, mine.num_events) != (
            record.observations, record.event_seq, record.num_events
        ):
            raise ReplayError(
                f"journal record {record.seq} replays differently: observations {mine.observations[:200]} "
                f"({mine.num_events} events from {mine.event_seq}), recorded {record.observations[:200]} "
                f"({record.num_events} events from {record.event_seq})"
            )
        return step

    def replay_all(self, records: Iterable[ev.SchedulerObserved]) -> list[Step]:
        return [self.replay(r) for r in records]

    # ---------------------------------------------------------------------------------- state

    def state(self) -> dict[str, Any]:
        """The whole state as plain JSON data (string keys): equal states mean equal schedulers."""
        shell = {
            "published": {str(v): list(p) for v, p in self.published.items()},
            "pending_steps": {str(v): p.state() for v, p in self.pending_steps.items()},
            "samples": self.samples,
            "rewards": {g: list(r) for g, r in self.rewards.items()},
            "loads": {r: list(p) for r, p in self.loads.items()},
            "positions": self.positions,
            "observed_seq": self.observed_seq,
            "event_seq": self.event_seq,
            "dispatched": self.dispatched,
        }
        loaded: dict[str, Any] = json.loads(canonical_json({"core": self.core.snapshot(), "shell": shell}))
        return loaded

    def checkpoint(self, *, with_state: bool) -> ev.SchedulerCheckpoint:
        state_text = canonical_json(self.state()) if with_state else ""
        return ev.SchedulerCheckpoint(
            producer=self.producer,
            correlation_id=self.run_id,
            run_id=self.run_id,
            observed_seq=self.observed_seq,
            event_seq=self.event_seq,
            config=canonical_json(self.decision_config),
            state_sha256=hashlib.sha256(state_text.encode("utf-8")).hexdigest() if with_state else "",
            state=state_text,
        )

    # ---------------------------------------------------------------------------------- derive

    def _derive(self, facts: Mapping[str, Any]) -> Derived:
        """Core observations of one input and whether it changed the shell's own state."""
        kind, t = facts["kind"], float(facts["t"])
        if kind == TICK:
            return [core.Tick(t)], False
        if kind == "registered":
            return [core.ResourceRegistered(t, facts["resource_id"], DeviceSpec(**facts["device"]), 0)], False
        rid = facts.get("resource_id")
        resource = self.core.pool.resources.get(rid) if isinstance(rid, str) else None
        alive = resource is not None and resource.alive
        if kind in _RESOURCE_INPUTS:
            if resource is None or not alive:
                return [], False
            return _RESOURCE_INPUTS[kind](self, t, facts, resource)
        if kind in ("trajectory", "batch"):
            return self._derive_samples(kind, t, facts), False
        if kind == "published":
            return self._derive_published(t, facts)
        if kind == "step_skipped":
            train = self.core.rollout.train
            if train is None or train.assignment_id != facts["assignment_id"]:
                return [], False
            return [core.TrainStepSkipped(t, train.assignment_id, train.step, str(facts["reason"]))], False
        if kind == "step_done":
            return self._derive_step_done(t, facts)
        raise ReplayError(f"unknown input kind {kind!r}")

    def _derive_heartbeat(self, t: float, facts: Mapping[str, Any], resource: Resource) -> Derived:
        if t - resource.last_heartbeat < self.coalesce_s:
            return [], False
        return [core.Heartbeat(t, resource.resource_id)], False

    def _derive_down(self, t: float, facts: Mapping[str, Any], resource: Resource) -> Derived:
        return [core.ResourceDown(t, facts["resource_id"], facts["reason"])], False

    def _derive_loaded(self, t: float, facts: Mapping[str, Any], resource: Resource) -> Derived:
        version = int(facts["version"])
        pending = self.core.rollout.weight_syncs.load_pending(resource.resource_id)
        if resource.weights_version == version and not pending:
            return [], False  # a second report of the same load (its ack and its WeightsLoaded event)
        return [core.WeightsLoaded(t, facts["resource_id"], version)], False

    def _derive_ack(self, t: float, facts: Mapping[str, Any], resource: Resource) -> Derived:
        command = self.loads.get(facts["resource_id"])
        if command is None or command[0] != facts["command_id"]:
            return [], False
        if facts["ok"]:
            return self._derive_loaded(t, {"resource_id": facts["resource_id"], "version": command[1]}, resource)
        return [core.ResourceDown(t, facts["resource_id"], "load_weights_failed")], False

    def _derive_samples(self, kind: str, t: float, facts: Mapping[str, Any]) -> list[core.Observation]:
        group = self.core.loader.groups.get(facts["group_id"])
        if group is None or group.completed:
            return []
        if kind == "trajectory":
            versions = tuple((int(v), int(n)) for v, n in facts["token_versions"])
            return self._samples(t, group.group_id, group.n_samples, [facts["trajectory_id"]], versions,
                                 facts["reward"])
        ids = list(facts["trajectory_ids"]) + [f"#{i}" for i in range(group.n_samples)]
        return self._samples(t, group.group_id, group.n_samples, ids, (), None)

    def _derive_published(self, t: float, facts: Mapping[str, Any]) -> Derived:
        version = int(facts["version"])
        if version in self.published:
            return [], False
        self.published[version] = (facts["uri"], facts["sha256"])
        pending = self.pending_steps.pop(version, None)
        return ([] if pending is None else self._step_done(t, version, pending)), True

    def _derive_step_done(self, t: float, facts: Mapping[str, Any]) -> Derived:
        version = int(facts["version"])
        report = PendingStep(int(facts["step"]), facts["assignment_id"], int(facts.get("filtered", 0)),
                             tuple(facts.get("added", ())))
        if version in self.published:
            return self._step_done(t, version, report), False
        if self.pending_steps.get(version) == report:
            return [], False
        self.pending_steps[version] = report
        return [], True

    def _samples(self, t: float, group_id: str, n_samples: int, trajectory_ids: Sequence[str],
                 token_versions: tuple[tuple[int, int], ...], reward: float | None) -> list[core.Observation]:
        seen = self.samples.get(group_id, {})
        out: list[core.Observation] = []
        tokens = sum(n for _, n in token_versions)
        for tid in trajectory_ids:
            if tid in seen or len(seen) >= n_samples:
                continue
            seen[tid] = len(seen)
            out.append(core.SampleCompleted(t, group_id, seen[tid], tokens, token_versions))
            if reward is not None:
                total, count = self.rewards.get(group_id, (0.0, 0))
                self.rewards[group_id] = (total + reward, count + 1)
        if out:
            self.samples[group_id] = seen
        return out

    def _step_done(self, t: float, version: int, report: PendingStep) -> list[core.Observation]:
        train = self.core.rollout.train
        if train is None or (report.assignment_id != train.assignment_id and report.step != train.step):
            log.warning("train step report does not match the running step",
                        extra={"service": "scheduler", "step": report.step, "version": version})
            return []
        return [core.TrainStepCompleted(t, train.assignment_id, train.step, version, report.filtered,
                                        report.added_group_ids)]


#: inputs about one resource, ignored unless it is registered and alive
_RESOURCE_INPUTS: dict[str, Callable[[JournaledScheduler, float, Mapping[str, Any], Resource], Derived]] = {
    "heartbeat": JournaledScheduler._derive_heartbeat,
    "down": JournaledScheduler._derive_down,
    "loaded": JournaledScheduler._derive_loaded,
    "ack": JournaledScheduler._derive_ack,
}
