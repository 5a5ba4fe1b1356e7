"""Follows a run on the bus: what the progress bars, the summary table and the charts show.

Everything here is derived from events (calls, trajectories, train steps, weight loads, activity tag
transitions), so the same numbers can be rebuilt later from the log with `sflow replay`.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from bus.config import BusConfig
from bus.consumer import BATCHED_FETCH, EventConsumer, Received, unique_group
from infra.scalars import ScalarWriter
from schemas import events as ev
from schemas.rollout_events import SessionStatus, is_held_out

TOPICS = ("llm.calls", "trajectories", "train", "weights", "scheduler")
BUSY = frozenset({"rollout", "train", "reference", "critic"})
Span = tuple[int, int]  # [start ms, end ms)


def merge_spans(spans: list[Span]) -> list[Span]:
    """The union of time spans as sorted, disjoint spans."""
    merged: list[Span] = []
    for t0, t1 in sorted(s for s in spans if s[1] > s[0]):
        if merged and t0 <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], t1))
        else:
            merged.append((t0, t1))
    return merged


def intersect_spans(a: list[Span], b: list[Span]) -> list[Span]:
    """The parts of spans `a` that fall inside spans `b`."""
    out = []
    inside = merge_spans(b)
    for a0, a1 in merge_spans(a):
        for b0, b1 in inside:
            lo, hi = max(a0, b0), min(a1, b1)
            if hi > lo:
                out.append((lo, hi))
    return out


#: TrainStepCompleted metrics the summary shows per step (first steps against last steps)
HEALTH_METRICS = ("entropy", "response_length_mean", "truncated_fraction", "zero_variance_fraction",
                  "clip_fraction_low", "clip_fraction_high", "kl")


def versions_text(versions: tuple[int, ...]) -> str:
    """'v3', or 'v3-v4' for a result whose tokens span a weight update ('v?' : none known)."""
    if not versions:
        return "v?"
    return f"v{versions[0]}" if len(versions) == 1 else f"v{versions[0]}-v{versions[-1]}"


@dataclass(frozen=True)
class RunProgress:
    """What the progress bars and the stop rule read every second: a few numbers, not a copy of the state."""

    steps: int
    version: int
    last_reward: float
    tokens_per_s: float
    calls: int
    trajectories: int
    ready_groups: int
    progress_ms: int


@dataclass
class RunState:
    """Raw facts of a run, in event order."""

    calls: int = 0  # of training rollouts (held-out evaluation calls are `held_out_calls`)
    held_out_calls: int = 0
    output_tokens: list[tuple[int, int]] = field(default_factory=list)  # (completed ms, tokens)
    trajectories: int = 0
    ready_groups: int = 0
    rewards: list[tuple[int, float]] = field(default_factory=list)  # (step, mean reward of the trained batch)
    # trajectory id -> (policy version it started under, reward): every training session, trained or not,
    # except the aborted ones: cut off (a run's stop, a drain) before the reward function ran, their reward
    # means nothing (the trainer skips them too), and they fall in the versions that were current at the stop
    session_rewards: dict[str, tuple[int, float]] = field(default_factory=dict)
    aborted_sessions: set[str] = field(default_factory=set)
    version: int = 0
    staleness: list[int] = field(default_factory=list)  # tokens by versions behind, summed over steps
    pauses_ms: list[float] = field(default_factory=list)
    activity: dict[str, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))
    versions_per_call: list[tuple[int, ...]] = field(default_factory=list)
    generating: dict[str, list[Span]] = field(default_factory=lambda: defaultdict(list))  # engine runs
    train_spans: list[Span] = field(default_factory=list)
    health: list[dict[str, float]] = field(default_factory=list)  # HEALTH_METRICS of each completed step
    filtered_groups: set[str] = field(default_factory=set)  # left out by dynamic sampling (zero reward variance)
    collapse: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)  # (step, collapse guard signals)
    evals: dict[int, ev.EvalCompleted] = field(default_factory=dict)  # held-out evaluations by step
    end_ms: int = 0
    progress_ms: int = 0  # when the latest LLM call or train step completed: what tells a run from a stalled one
    # Calls recorded but in no trajectory yet, and trajectory calls whose LLMCall is not seen yet (the
    # two topics are read independently, so either may come first).
    unassembled: set[str] = field(default_factory=set)
    assembled_early: set[str] = field(default_factory=set)

    @property
    def steps(self) -> int:
        return len(self.rewards)

    @property
    def last_reward(self) -> float:
        return self.rewards[-1][1] if self.rewards else 0.0

    def rollout_rewards(self) -> list[tuple[int, float]]:
        """(policy version, mean reward of the sessions started under it), oldest first. The trained
        batch's reward leaves out what dynamic sampling filtered (groups all right, or all wrong); this
        is what the policy of each version earned on the training tasks (aborted sessions left out)."""
        by_version: dict[int, list[float]] = defaultdict(list)
        for version, reward in self.session_rewards.values():
            by_version[version].append(reward)
        return [(v, sum(rs) / len(rs)) for v, rs in sorted(by_version.items())]

    @property
    def tokens_per_s(self) -> float:
        """Over the last 20 s. Calls arrive nearly in completion order (four partitions): the scan goes back
        from the newest and stops 5 s of completion times before the window, not at the first older call."""
        if not self.output_tokens:
            return 0.0
        horizon = self.output_tokens[-1][0] - 20_000
        total = 0
        for t, n in reversed(self.output_tokens):
            if t < horizon - 5_000:
                break
            total += n if t >= horizon else 0
        return total / 20.0

    def progress(self) -> RunProgress:
        return RunProgress(self.steps, self.version, self.last_reward, self.tokens_per_s, self.calls,
                           self.trajectories, self.ready_groups, self.progress_ms)

    @property
    def mean_tokens_per_s(self) -> float:
        if len(self.output_tokens) < 2:
            return 0.0
        span = (self.output_tokens[-1][0] - self.output_tokens[0][0]) / 1000
        return sum(n for _, n in self.output_tokens) / max(span, 1e-3)

    @property
    def mean_staleness(self) -> float:
        total = sum(self.staleness)
        return sum(i * n for i, n in enumerate(self.staleness)) / total if total else 0.0

    @property
    def mean_pause_ms(self) -> float:
        return sum(self.pauses_ms) / len(self.pauses_ms) if self.pauses_ms else 0.0

    @property
    def max_pause_ms(self) -> float:
        return max(self.pauses_ms, default=0.0)

    @property
    def calls_spanning_update(self) -> int:
        """Calls whose output tokens come from more than one policy version (a weight update mid-call)."""
        return sum(1 for versions in self.versions_per_call if len(versions) > 1)

    def health_first_last(self, k: int) -> dict[str, tuple[float, float]]:
        """Each of HEALTH_METRICS as (mean over the first k steps, mean over the last k)."""
        if not self.health:
            return {}
        first, last = self.health[:k], self.health[-k:]
        return {m: (sum(h[m] for h in first) / len(first), sum(h[m] for h in last) / len(last))
                for m in HEALTH_METRICS}

    def collapse_verdict(self) -> str:
        """What the collapse guard said: when it first fired and its last signals, or that it never did."""
        if not self.collapse:
            return "never fired"
        (first, _), (last, signals) = self.collapse[0], self.collapse[-1]
        return f"fired on {len(self.collapse)} step(s), first at step {first}; step {last}: " + "; ".join(signals)

    def eval_start_end(self) -> str:
        """Held-out accuracy at the first and the last evaluation, each with the versions it measured."""
        if not self.evals:
            return "no evaluation"
        first, last = self.evals[min(self.evals)], self.evals[max(self.evals)]
        ends = " -> ".join(f"{e.accuracy:.3f} ({e.trigger}, {versions_text(e.versions)})" for e in (first, last))
        return f"{ends}; {len(self.evals)} evaluations, {self.held_out_calls} calls"

    def eval_summary(self) -> list[dict[str, object]]:
        """The evaluations for summary.json, in step order."""
        return [{"step": e.step, "trigger": e.trigger, "accuracy": e.accuracy, "reward": e.reward_mean,
                 "versions": list(e.versions), "num_tasks": e.num_tasks, "failed": e.failed}
                for _, e in sorted(self.evals.items())]

    def _activities(self, rid: str) -> list[tuple[Span, str]]:
        """A resource's activity tags as (span, activity), each lasting until the next or the run's end."""
        spans = self.activity.get(rid, [])
        return [((t0, max(t0, t1)), act) for (t0, act), (t1, _) in zip(spans, [*spans[1:], (self.end_ms, "")],
                                                                         strict=True)]

    def _observed_ms(self, rid: str) -> float:
        spans = self.activity.get(rid, [])
        return max(1.0, float(self.end_ms - spans[0][0])) if spans else 1.0

    def utilisation(self) -> dict[str, tuple[float, float]]:
        """(busy share, idle share) per resource from its activity transitions to the end of the run."""
        out: dict[str, tuple[float, float]] = {}
        for rid in self.activity:
            busy = idle = 0.0
            for (t0, t1), act in self._activities(rid):
                busy += t1 - t0 if act in BUSY else 0
                idle += t1 - t0 if act == "idle" else 0
            out[rid] = (busy / self._observed_ms(rid), idle / self._observed_ms(rid))
        return out

    def work_share(self) -> dict[str, float]:
        """Share of each resource's time spent on real work, measured rather than tagged: the union of
        the engine runs (call segments) it served, plus the train steps that ran while it held `train`.

        A resource tagged `rollout` whose engine has nothing to generate counts as tagged-busy in
        `utilisation` but not here; the gap between the two is rollout capacity the run left unused.
        """
        out: dict[str, float] = {}
        for rid in self.activity:
            training = [span for span, act in self._activities(rid) if act == "train"]
            out[rid] = self._share(rid, [*self.generating.get(rid, []), *intersect_spans(self.train_spans, training)])
        return out

    def rollout_work_share(self) -> dict[str, float]:
        """Share of each resource's time its engine ran requests (the union of its call segments):
        on a train-capable resource, what it did while lent to rollout."""
        return {rid: self._share(rid, self.generating.get(rid, [])) for rid in self.activity}

    def _share(self, rid: str, spans: list[Span]) -> float:
        """The share of `rid`'s observed time that the union of `spans` covers."""
        return sum(t1 - t0 for t0, t1 in merge_spans(spans)) / self._observed_ms(rid)

    def apply(self, event: ev.Event) -> None:
        self.end_ms = max(self.end_ms, event.ts_ms)
        if isinstance(event, ev.TrainStepCompleted):
            self.filtered_groups.update(event.filtered_group_ids)
        if isinstance(event, ev.LLMCall | ev.TrainStepCompleted):
            self.progress_ms = max(self.progress_ms, event.ts_ms)
        if isinstance(event, ev.LLMCall):
            if is_held_out(event.group_id):  # an evaluation's call: real engine work, but no rollout of training
                self.held_out_calls += 1
            else:
                self.calls += 1
                self.versions_per_call.append(tuple(sorted(set(event.output_versions.tolist()))))
            self.output_tokens.append((event.completed_ms, len(event.output_ids)))
            for seg in event.segments:
                self.generating[seg.resource_id].append((seg.started_ms, seg.ended_ms))
            if event.call_id in self.assembled_early:
                self.assembled_early.discard(event.call_id)
            else:
                self.unassembled.add(event.call_id)
        elif isinstance(event, ev.Trajectory):
            if not is_held_out(event.group_id):
                self.trajectories += 1
                if event.status == SessionStatus.ABORTED:
                    self.aborted_sessions.add(event.trajectory_id)
                else:
                    self.session_rewards[event.trajectory_id] = (event.min_version, event.reward)
            for call_id in event.call_ids:
                if call_id in self.unassembled:
                    self.unassembled.discard(call_id)
                else:
                    self.assembled_early.add(call_id)
        elif isinstance(event, ev.BatchReady):
            self.ready_groups += 1
        elif isinstance(event, ev.TrainStepCompleted):
            if event.status != "skipped" and all(s != event.step for s, _ in self.rewards):
                self.rewards.append((event.step, event.reward_mean))
                self.train_spans.append((event.ts_ms - int(event.duration_ms), event.ts_ms))
                self.version = max(self.version, event.new_version)
                self.health.append({m: float(getattr(event, m)) for m in HEALTH_METRICS})
                if event.collapse_signals:
                    self.collapse.append((event.step, event.collapse_signals))
                for i, n in enumerate(event.staleness_histogram):
                    if i >= len(self.staleness):
                        self.staleness.append(0)
                    self.staleness[i] += n
        elif isinstance(event, ev.EvalCompleted):
            self.evals.setdefault(event.step, event)
        elif isinstance(event, ev.WeightsLoaded):
            self.pauses_ms.append(event.pause_ms)
        elif isinstance(event, ev.TagTransition) and event.tag_kind == ev.TagKind.ACTIVITY and event.to_tags:
            self.activity[event.resource_id].append((event.ts_ms, event.to_tags[0]))


class RunMonitor:
    """A background consumer keeping a `RunState` up to date."""

    def __init__(self, bus: BusConfig, run_id: str, scalars: ScalarWriter | None = None) -> None:
        self.state = RunState()
        self.scalars = scalars  # the train metrics as TensorBoard scalars, written as their events arrive
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = EventConsumer(bus, unique_group(f"monitor-{run_id}"), TOPICS, **BATCHED_FETCH)
        self._thread = threading.Thread(target=self._loop, name="run-monitor", daemon=True)
        self._last_event = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        # A throwaway group: nothing committed; an event the state cannot apply ends the thread.
        self._consumer.run(self._apply, self._stop, on_batch=self._note_events, on_error="raise", commit=False)

    def _apply(self, r: Received) -> None:
        with self._lock:
            self.state.apply(r.event)
        if self.scalars is not None:
            self.scalars.write(r.event)

    def _note_events(self, batch: list[Received]) -> None:
        if batch:
            self._last_event = time.monotonic()

    def drain(self, quiet_s: float) -> None:
        """Waits until no event arrived for `quiet_s` (the last ones of stopped services)."""
        while time.monotonic() - self._last_event < quiet_s:
            time.sleep(0.2)

    def wait_assembled(self, timeout_s: float) -> int:
        """Waits until every recorded call is in a trajectory; answers how many are still not.

        A shutdown that stops the trajectory processor before the last sessions' trajectories are out
        leaves recorded calls in no trajectory: the run's log would not account for them.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                missing = len(self.state.unassembled)
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(0.2)

    def wait_eval(self, step: int, timeout_s: float) -> bool:
        """Waits until the held-out evaluation of `step` is recorded (False: not within `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if step in self.state.evals:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def snapshot(self) -> RunState:
        """A copy of the whole state (for the summary); every second, `progress` is what to read."""
        with self._lock:
            return copy.deepcopy(self.state)

    def progress(self) -> RunProgress:
        """The figures `follow` shows and stops on: the deep copy of a long run's state (every call's versions
        and spans) was most of the job driver's CPU when taken every second."""
        with self._lock:
            return self.state.progress()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close(commit=False)
        if self.scalars is not None:
            self.scalars.close()
