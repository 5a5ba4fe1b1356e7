"""The events a train step publishes, as functions of the step: every attempt at a step builds the same ids.

Ids are `step_event_id(run_id, step, type)`: a redone step repeats its TrainStepStarted (same id: a
detectable retry), and a TrainStepCompleted or WeightsPublished id always means the same step and
content, so consumers drop repeated ids.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from pathlib import Path

from schemas.events import TrainStepCompleted, TrainStepStarted, Trajectory, WeightsPublished
from trainer_svc import checkpoint as ckpt
from trainer_svc.dynamic_sampling import Fill
from trainer_svc.step_result import StepResult

#: uuid5 namespace of the step event ids (fixed forever: a redone step must get the same ids).
NAMESPACE = uuid.UUID("0c3f6a57-8d2e-4b61-a9c4-7e15d2b0f3a8")
SKIPPED = "skipped"


def step_event_id(run_id: str, step: int, event_type: str) -> str:
    """Id of the `event_type` event of train step `step` of a run (every attempt at the step shares it)."""
    return uuid.uuid5(NAMESPACE, f"{run_id}/{step}/{event_type}").hex


@dataclasses.dataclass(frozen=True)
class StepOrigin:
    """Who publishes a step's events and which request they answer (the assignment id, else the run id)."""

    run_id: str
    producer: str
    correlation_id: str


def started_event(origin: StepOrigin, step: int, policy_version: int, resource_ids: tuple[str, ...],
                  trajectories: Sequence[Trajectory]) -> TrainStepStarted:
    return TrainStepStarted(
        event_id=step_event_id(origin.run_id, step, "TrainStepStarted"), producer=origin.producer,
        correlation_id=origin.correlation_id, run_id=origin.run_id, step=step, policy_version=policy_version,
        resource_ids=resource_ids, num_trajectories=len(trajectories),
        num_tokens=sum(t.tokens_in_tree for t in trajectories),
    )


def completed_event(origin: StepOrigin, result: StepResult, fill: Fill | None = None) -> TrainStepCompleted:
    """The step's report; the groups dynamic sampling filtered before it count in its zero-variance share."""
    filtered = fill.filtered if fill is not None else ()
    groups = result.num_groups + len(filtered)
    return dataclasses.replace(
        result.to_event(run_id=origin.run_id, producer=origin.producer),
        event_id=step_event_id(origin.run_id, result.step, "TrainStepCompleted"),
        correlation_id=origin.correlation_id,
        zero_variance_fraction=(result.zero_variance_groups + len(filtered)) / groups if groups else 0.0,
        filtered_group_ids=filtered, added_group_ids=fill.added if fill is not None else (),
    )


def skipped_event(origin: StepOrigin, step: int, version: int, group_ids: Sequence[str], reason: str,
                  duration_ms: float = 0.0) -> TrainStepCompleted:
    """A step that trained nothing: the unchanged version, why, and its groups (the scheduler re-plans them).

    The id is a function of the step and its groups: a restart that re-reads the same assignment and
    skips it again publishes the same event, which consumers drop as a duplicate."""
    groups = tuple(sorted(set(group_ids)))
    detail = f"{origin.correlation_id}/{','.join(groups)}"
    return TrainStepCompleted(
        event_id=step_event_id(origin.run_id, step, f"TrainStepCompleted/{SKIPPED}/{detail}"),
        producer=origin.producer, correlation_id=origin.correlation_id, run_id=origin.run_id, step=step,
        new_version=version, loss=0.0, reward_mean=0.0, kl=0.0, clip_fraction=0.0, num_tokens=0,
        duration_ms=duration_ms, status=SKIPPED, reason=reason, dropped_group_ids=groups,
    )


def weights_event(origin: StepOrigin, model: str, directory: Path, ts_ms: int) -> WeightsPublished:
    """WeightsPublished of a committed checkpoint; a function of the directory (and the recorded time)."""
    progress = ckpt.read_progress(directory)
    num_bytes = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
    return WeightsPublished(
        event_id=step_event_id(origin.run_id, progress.step, "WeightsPublished"), ts_ms=ts_ms,
        producer=origin.producer, correlation_id=origin.correlation_id, model=model,
        version=progress.version, uri=directory.resolve().as_uri(), sha256=progress.weights_sha256,
        step=progress.step, num_bytes=num_bytes,
    )
