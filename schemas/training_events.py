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


@dataclass(frozen=True, kw_only=True)
class EvalCompleted(Event):
    run_id: str
    eval_id: str
    step: int
    trigger: str
    num_tasks: int
    accuracy: float
    reward_mean: float
    versions: tuple[int, ...] = ()
    task_ids: tuple[str, ...] = ()
    task_scores: tuple[float, ...] = ()
    task_min_versions: tuple[int, ...] = ()
    task_max_versions: tuple[int, ...] = ()
    failed: int = 0
    temperature: float = 0.0
    tasks_seed: int = 0
    duration_ms: float = 0.0

    @property
    def key(self) -> str:
        return self.run_id

    @property
    def pinned(self) -> bool:
        """Every token of the evaluation came from one weight version."""
        return len(self.versions) == 1
