"""Running estimates of an adaptive spatiotemporal policy, updated only from records of the log.

They come only from what the core observes, so a replayed log rebuilds them exactly (the rules that
decide on them are `scheduler_svc.lending`'s):

* group production rate: completed groups per second over the last `window` completions;
* train throughput: tokens trained per second per train resource, over the last step: the better of
  the whole step (assignment to `TrainStepCompleted`, switch and optimizer included) and its tail
  (the final `TrainData` to `TrainStepCompleted`: what was left, optimizer included). Each is a lower
  bound on the real speed (the first includes waiting for micro-batches, the second any backlog), so
  waiting on stragglers does not make training look slow;
* the return cost: `LoadWeights` to `WeightsLoaded` of a resource coming back from training (weight
  load plus role switch), observed; before the first return, the longest observed weight load of any
  resource plus the switch prior. The switch into training is not observable by the core and uses
  `SchedulerSettings.switch_estimate_s`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from scheduler_svc import decisions as d
from scheduler_svc.tags import TRAIN

#: completions over which the production rate is measured (a micro-batch's worth is enough to react)
RATE_WINDOW = 32
#: causes of a LoadWeights that brings a train-capable resource back from training to rollout
RETURN_CAUSES = ("train_step_done", "lend")
#: step periods (between two TrainStepCompleted) whose mean is the pipeline's period for the train-bound
#: test: one period alone oscillates (a step started on a backlog ends soon after the last one, and the
#: short period then reads as train bound: the next step starts on a partial batch and its trainers wait
#: in it for the stragglers; measured on the simulator's math 32 x H800, 16 steps: 8 % bubble)
PERIOD_WINDOW = 4
#: completed groups whose latencies (dispatch to TaskCompleted) the stragglers' rest is read from
LATENCY_WINDOW = 64
#: bounds of the tail factor: the last groups of a batch come slower than the rate says (the long
#: tail), but one odd step must not make every later estimate absurd
TAIL_BIAS_RANGE = (0.5, 8.0)


@dataclass
class Estimates:
    """Running estimates, updated only from records (see the module doc)."""

    done_times: deque[float] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    tokens_per_resource_s: float | None = None
    return_s: float | None = None
    step_started: float | None = None
    load_started: dict[str, tuple[float, bool]] = field(default_factory=dict)  # rid -> (sent, a return)
    group_tokens: float | None = None  # mean tokens of a completed group (EWMA)
    final_fed: tuple[float, int] | None = None  # the running step's final TrainData: (time, tokens)
    load_s: float | None = None  # longest observed weight load (the return's prior)
    data_span_s: float | None = None  # the last step's start to its final TrainData: its batch's arrival
    last_step_end: float | None = None
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=PERIOD_WINDOW))  # the last step periods
    tail_bias: float = 1.0  # observed stragglers' rest / its rate-based prediction (the long tail's factor)
    first_fed: tuple[float, float] | None = None  # the running step's first partial TrainData: (time, rest predicted)
    dispatched_at: dict[str, float] = field(default_factory=dict)  # group -> its dispatch time, while rolling out
    context_area: float = 0.0  # since the last step's end: sum over completed samples of latency x tokens / 2
    inflight_context: float | None = None  # time-averaged context tokens held by running requests (last period)
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))  # dispatch to completion

    def group_done(self, t: float, tokens: int) -> None:
        self.done_times.append(t)
        self.group_tokens = tokens if self.group_tokens is None else 0.9 * self.group_tokens + 0.1 * tokens

    def step_started_at(self, t: float) -> None:
        self.step_started = t

    def fed(self, t: float, groups: int, final: bool, batch_groups: int) -> None:
        """Calibrate the stragglers' rest: a step's first partial micro-batch predicts (by the rate)
        when the rest of its batch arrives, its final one says when it did."""
        if not final:
            if self.first_fed is None:
                predicted = self.seconds_for(batch_groups - groups)
                self.first_fed = None if predicted is None else (t, predicted)
            return
        first, self.first_fed = self.first_fed, None
        if first is not None and first[1] > 0:
            observed = min(TAIL_BIAS_RANGE[1], max(TAIL_BIAS_RANGE[0], (t - first[0]) / first[1]))
            self.tail_bias = 0.5 * self.tail_bias + 0.5 * observed

    def rest_s(self, groups: int) -> float | None:
        """Seconds until `groups` more complete: the rate's estimate times the observed tail factor."""
        seconds = self.seconds_for(groups)
        return None if seconds is None else seconds * self.tail_bias

    def sample_done(self, t: float, group_id: str, tokens: int) -> None:
        """A sample held a context growing to `tokens` over its latency: on average half of it."""
        started = self.dispatched_at.get(group_id)
        if started is not None and t > started:
            self.context_area += (t - started) * tokens / 2

    def step_done(self, t: float, tokens: int, resources: int) -> None:
        if self.last_step_end is not None and t > self.last_step_end:
            self.intervals.append(t - self.last_step_end)
            self.inflight_context = self.context_area / self.intervals[-1]
        self.context_area = 0.0
        self.last_step_end = t
        started, final, self.step_started, self.final_fed = self.step_started, self.final_fed, None, None
        self.first_fed = None
        if started is None or resources < 1 or tokens <= 0 or t <= started:
            return
        speed = tokens / ((t - started) * resources)
        if final is not None and t > final[0]:
            speed = max(speed, final[1] / ((t - final[0]) * resources))
        self.tokens_per_resource_s = speed
        self.data_span_s = 0.0 if final is None else max(0.0, final[0] - started)

    def load_sent(self, resource_id: str, t: float, returning: bool) -> None:
        self.load_started[resource_id] = (t, returning)

    def loaded(self, resource_id: str, t: float) -> None:
        started = self.load_started.pop(resource_id, None)
        if started is None:
            return
        seconds = t - started[0]
        if started[1]:
            self.return_s = seconds
        else:
            self.load_s = seconds if self.load_s is None else max(self.load_s, seconds)

    def round_trip_s(self, switch_s: float) -> float | None:
        """Lending's cost: the return (observed, else a plain weight load plus a switch) and the switch
        back into training."""
        back = self.return_s if self.return_s is not None else None if self.load_s is None else self.load_s + switch_s
        return None if back is None else back + switch_s

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

    @property
    def step_interval_s(self) -> float | None:
        """Between the last two TrainStepCompleted."""
        return self.intervals[-1] if self.intervals else None

    @property
    def period_s(self) -> float | None:
        """The pipeline's period: the mean of the last `PERIOD_WINDOW` step periods."""
        return sum(self.intervals) / len(self.intervals) if self.intervals else None

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
            "final_fed": self.final_fed,
            "load_s": self.load_s,
            "data_span_s": self.data_span_s,
            "last_step_end": self.last_step_end,
            "step_interval_s": self.step_interval_s,
            "intervals": tuple(self.intervals),
            "tail_bias": self.tail_bias,
            "first_fed": self.first_fed,
            "dispatched_at": dict(sorted(self.dispatched_at.items())),
            "context_area": self.context_area,
            "inflight_context": self.inflight_context,
            "latencies": tuple(self.latencies),
            "load_started": dict(sorted(self.load_started.items())),
        }


def observe(
    est: Estimates, record: object, now: float, step_tokens: int, step_resources: int, batch_groups: int = 0
) -> None:
    """Update the estimates from one record of the log (`step_tokens`/`step_resources`: the running
    step's, read before a TrainStepCompleted clears it; `batch_groups`: B)."""
    if isinstance(record, d.TaskCompleted):
        est.group_done(now, record.n_tokens)
        started = est.dispatched_at.pop(record.group_id, None)
        if started is not None:
            est.latencies.append(now - started)
    elif isinstance(record, d.TaskDispatched):
        est.dispatched_at[record.group_id] = now
    elif isinstance(record, d.TaskAborted):
        est.dispatched_at.pop(record.group_id, None)
    elif isinstance(record, d.SampleCompleted):
        est.sample_done(record.t, record.group_id, record.n_tokens)
    elif isinstance(record, d.Assignment) and record.task_kind == TRAIN:
        est.step_started_at(now)
    elif isinstance(record, d.TrainData):
        if record.final:
            est.final_fed = (now, sum(n for _, n in record.token_lags))
        est.fed(now, len(record.group_ids), record.final, batch_groups)
    elif isinstance(record, d.TrainStepCompleted):
        est.step_done(record.t, step_tokens, step_resources)
    elif isinstance(record, d.LoadWeights):
        est.load_sent(record.resource_id, now, record.cause in RETURN_CAUSES)
    elif isinstance(record, d.WeightsLoaded):
        est.loaded(record.resource_id, record.t)
