"""The trainer's Prometheus series (`bus.metrics.CATALOG`): what each step did, observed once per step,
and the buffer and version, read when Prometheus scrapes. `ServiceConfig.metrics_port` serves them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from bus.metrics import ServiceMetrics
from trainer_svc.ledger import Ledger
from trainer_svc.step_result import StepResult


class TrainerMetrics:
    """The series of one trainer; `ledger` and `version` are read at scrape time (a restore replaces them)."""

    def __init__(self, ledger: Callable[[], Ledger], version: Callable[[], int]) -> None:
        self.registry = ServiceMetrics("trainer")
        self.steps: Counter[str] = Counter()
        self.tokens = 0
        self._step_time = self.registry.histogram("sflow_trainer_step_seconds")
        self._last = {name: self.registry.gauge(f"sflow_trainer_{name}")
                      for name in ("loss", "reward_mean", "entropy", "response_length_mean")}
        self.registry.read("sflow_trainer_steps_total", lambda: {(status,): n for status, n in self.steps.items()})
        self.registry.read("sflow_trainer_trained_tokens_total", lambda: self.tokens)
        self.registry.read("sflow_trainer_policy_version", version)
        self.registry.read("sflow_trainer_buffered_trajectories",
                           lambda: sum(len(g.trajectories) for g in list(ledger().groups.values())))

    def completed(self, result: StepResult, seconds: float) -> None:
        self.steps["completed"] += 1
        self.tokens += result.num_trainable_tokens
        self._step_time.observe(seconds)
        for name, gauge in self._last.items():
            gauge.set(getattr(result, name))

    def skipped(self, seconds: float) -> None:
        self.steps["skipped"] += 1
        self._step_time.observe(seconds)
