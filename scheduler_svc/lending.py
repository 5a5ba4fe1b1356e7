"""Cost-aware lending: the estimates an adaptive spatiotemporal policy decides on, and its two rules.

A fixed spatiotemporal policy preempts its train-capable resources as soon as a batch (or its first
micro-batch) is ready and lends them back to rollout after every step, whatever that costs. Both are
bets: lending pays only if the rollout work a lent resource does before the next step outweighs what
the round trip costs (a weight load and a role switch back, a switch to training again, the re-prefill
of the requests it held), and starting a step on the ready groups pays only if the stragglers will be
done by the time those groups are trained (else the trainers wait in the step, neither training nor
rolling out). A policy that can decline either bet is at least as good as the fixed one that always
takes it, and at least as good as a fixed disaggregated split (which never lends).

The estimates come only from what the core observes, so a replayed log rebuilds them exactly:

* group production rate: completed groups per second over the last `window` completions;
* train throughput: tokens trained per second per train resource, over the last step (assignment to
  `TrainStepCompleted`, so switch and optimizer time are included: what a step really costs);
* the return cost: `LoadWeights` to `WeightsLoaded` of a resource coming back from training (weight
  load plus role switch), observed; the switch into training is not observable by the core and
  uses `SchedulerSettings.switch_estimate_s`.

Rules (each decision's numbers go into its `reason`):

* start: a partial batch starts training when ``rest_s <= switch_s + train_s(ready)``: the groups still
  missing will be complete before the ready ones are trained;
* lend: a train-capable resource free after a step goes back to rollout when the window until the
  next step is expected to start exceeds the round trip, ``window_s > return_s + switch_s``.
Without estimates (the first step) both rules take the bet, i.e. behave as the fixed policy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from scheduler_svc.decisions import Assignment, LoadWeights, TaskCompleted, TrainStepCompleted, WeightsLoaded
from scheduler_svc.tags import TRAIN

#: completions over which the production rate is measured (a micro-batch's worth is enough to react)
RATE_WINDOW = 32
#: causes of a LoadWeights that brings a train-capable resource back from training to rollout
RETURN_CAUSES = ("train_step_done", "lend")
#: TagTransition cause of a resource kept for training instead of lent
LEND_DECLINED = "lend_declined"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One cost-aware decision: take the bet or not, and the estimates it was taken on."""

    take: bool
    benefit_s: float | None
    cost_s: float | None
    what: str

    @property
    def reason(self) -> str:
        if self.benefit_s is None or self.cost_s is None:
            return f"{self.what}: no estimate yet, default"
        verb = ">" if self.take else "<="
        return f"{self.what}: est {self.benefit_s:.1f}s {verb} cost {self.cost_s:.1f}s"


@dataclass
class Estimates:
    """Running estimates, updated only from records (see the module doc)."""

    done_times: deque[float] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    tokens_per_resource_s: float | None = None
    return_s: float | None = None
    step_started: float | None = None
    load_started: dict[str, float] = field(default_factory=dict)
    group_tokens: float | None = None  # mean tokens of a completed group (EWMA)

    def group_done(self, t: float, tokens: int) -> None:
        self.done_times.append(t)
        self.group_tokens = tokens if self.group_tokens is None else 0.9 * self.group_tokens + 0.1 * tokens

    def step_started_at(self, t: float) -> None:
        self.step_started = t

    def step_done(self, t: float, tokens: int, resources: int) -> None:
        if self.step_started is None or resources < 1 or tokens <= 0 or t <= self.step_started:
            return
        self.tokens_per_resource_s = tokens / ((t - self.step_started) * resources)
        self.step_started = None

    def load_sent(self, resource_id: str, t: float) -> None:
        self.load_started[resource_id] = t

    def loaded(self, resource_id: str, t: float) -> None:
        started = self.load_started.pop(resource_id, None)
        if started is not None:
            self.return_s = t - started

    def rate(self) -> float | None:
        """Completed groups per second lately (None: too few completions to tell)."""
        times = self.done_times
        if len(times) < 2 or times[-1] <= times[0]:
            return None
        return (len(times) - 1) / (times[-1] - times[0])

    def seconds_for(self, groups: int) -> float | None:
        rate = self.rate()
        if groups <= 0:
            return 0.0
        return None if rate is None else groups / rate

    def train_s(self, tokens: int, resources: int) -> float | None:
        if self.tokens_per_resource_s is None or resources < 1:
            return None
        return tokens / (self.tokens_per_resource_s * resources)

    def snapshot(self) -> dict[str, Any]:
        return {
            "done_times": tuple(self.done_times),
            "tokens_per_resource_s": self.tokens_per_resource_s,
            "return_s": self.return_s,
            "group_tokens": self.group_tokens,
            "step_started": self.step_started,
            "load_started": dict(sorted(self.load_started.items())),
        }


def start_verdict(est: Estimates, *, missing: int, ready_tokens: int, resources: int, switch_s: float) -> Verdict:
    """Start a step on the ready groups now? Pays when the `missing` groups will be complete by the
    time the ready ones are trained (benefit: the train time that hides the stragglers' rest)."""
    rest = est.seconds_for(missing)
    train = est.train_s(ready_tokens, resources)
    if rest is None or train is None:
        return Verdict(True, None, None, "start")
    hidden = switch_s + train
    return Verdict(rest <= hidden, hidden, rest, "start (train hides vs stragglers' rest)")


def lend_verdict(
    est: Estimates, *, missing_first: int, missing_all: int, batch_groups: int, resources: int, switch_s: float
) -> Verdict:
    """Lend a free train-capable resource to rollout? Pays when the expected window until the next
    step starts exceeds the round trip (return load + switch into training again). The next step
    starts once its first micro-batch is ready (`missing_first` groups away) and the rest of the
    batch (`missing_all`) will be done while the ready part trains (the start rule)."""
    first = est.seconds_for(missing_first)
    rest = est.seconds_for(missing_all)
    train = None if est.group_tokens is None else est.train_s(round(est.group_tokens * batch_groups), resources)
    if first is None or rest is None or train is None or est.return_s is None:
        return Verdict(True, None, None, "lend")
    window = max(first, rest - (switch_s + train))
    cost = est.return_s + switch_s
    return Verdict(window > cost, window, cost, "lend")


def observe(est: Estimates, record: object, now: float, step_tokens: int, step_resources: int) -> None:
    """Update the estimates from one record of the log (`step_tokens`/`step_resources`: the running
    step's, read before a TrainStepCompleted clears it)."""
    if isinstance(record, TaskCompleted):
        est.group_done(now, record.n_tokens)
    elif isinstance(record, Assignment) and record.task_kind == TRAIN:
        est.step_started_at(now)
    elif isinstance(record, TrainStepCompleted):
        est.step_done(record.t, step_tokens, step_resources)
    elif isinstance(record, LoadWeights) and record.cause in RETURN_CAUSES:
        est.load_sent(record.resource_id, now)
    elif isinstance(record, WeightsLoaded):
        est.loaded(record.resource_id, record.t)
