"""Train steps: the groups the scheduler hands a step, and what each step did.

Topic `train` (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.envelope import Event


@dataclass(frozen=True, kw_only=True)
class TrainData(Event):
    run_id: str
    assignment_id: str
    step: int
    group_ids: tuple[str, ...] = ()
    group_versions: tuple[int, ...] = ()
    staleness_histogram: tuple[int, ...] = ()
    final: bool

    @property
    def key(self) -> str:
        return self.run_id


@dataclass(frozen=True, kw_only=True)
class TrainStepStarted(Event):
    run_id: str
    step: int
    policy_version: int
    resource_ids: tuple[str, ...] = ()
    num_trajectories: int
    num_tokens: int

    @property
    def key(self) -> str:
        return self.run_id


@dataclass(frozen=True, kw_only=True)
class TrainStepCompleted(Event):
    run_id: str
    step: int
    new_version: int
    loss: float
    reward_mean: float
    kl: float
    clip_fraction: float
    staleness_histogram: tuple[int, ...] = ()
    num_tokens: int
    trajectory_ids: tuple[str, ...] = ()
    duration_ms: float
    status: str = "completed"
    reason: str = ""
    dropped_group_ids: tuple[str, ...] = ()
    entropy: float = 0.0
    response_length_mean: float = 0.0
    clip_fraction_low: float = 0.0
    clip_fraction_high: float = 0.0
    truncated_fraction: float = 0.0
    zero_variance_fraction: float = 0.0
    filtered_group_ids: tuple[str, ...] = ()
    added_group_ids: tuple[str, ...] = ()
    collapse_signals: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.run_id
