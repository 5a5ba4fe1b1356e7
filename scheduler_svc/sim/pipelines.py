"""The five pipelines of the paper's figure 4, each expressed as a tag policy of the one scheduler."""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from scheduler_svc.errors import ConfigError
from scheduler_svc.policies import StragglerRule, TagPolicy, colocated, disaggregated, spatiotemporal


class Pipeline(StrEnum):
    COLOCATED_SYNC = "colocated_sync"
    DISAGGREGATED_NAIVE = "disaggregated_naive"
    MICROBATCH = "microbatch"
    OFFPOLICY_FILL = "offpolicy_fill"
    SPATIOTEMPORAL = "spatiotemporal"


PIPELINES: tuple[Pipeline, ...] = tuple(Pipeline)

DESCRIPTIONS: dict[Pipeline, str] = {
    Pipeline.COLOCATED_SYNC: "verl-style: all devices roll out, then all train (on-policy)",
    Pipeline.DISAGGREGATED_NAIVE: "fixed train / rollout devices, rollout then train (on-policy)",
    Pipeline.MICROBATCH: "disaggregated, training starts on the first micro-batch (on-policy)",
    Pipeline.OFFPOLICY_FILL: "disaggregated micro-batch pipeline filled with one-step off-policy rollouts",
    Pipeline.SPATIOTEMPORAL: "SeamlessFlow: train devices also roll out, preempted for each step (1-step async)",
}


def pipeline_policy(
    name: str,
    train_resources: int,
    microbatches: int,
    *,
    max_staleness: int | None = None,
    strict_staleness: bool = True,
    straggler: StragglerRule = StragglerRule.WAIT,
    max_regenerations: int = 1,
) -> TagPolicy:
    """The pipeline's tag policy. The staleness knobs apply to every pipeline alike; for the
    synchronous ones (bound 0, batch dispatched whole) they change nothing. `max_staleness`
    overrides the asynchronous pipelines' bound (1)."""
    eta = 1 if max_staleness is None else max_staleness
    if name == Pipeline.COLOCATED_SYNC:
        policy = colocated(max_staleness=0)
    elif name == Pipeline.DISAGGREGATED_NAIVE:
        policy = disaggregated(train_resources, max_staleness=0)
    elif name == Pipeline.MICROBATCH:
        policy = disaggregated(train_resources, max_staleness=0, train_microbatches=microbatches)
    elif name == Pipeline.OFFPOLICY_FILL:
        policy = disaggregated(train_resources, max_staleness=eta, train_microbatches=microbatches)
    elif name == Pipeline.SPATIOTEMPORAL:
        policy = spatiotemporal(train_resources, max_staleness=eta, train_microbatches=microbatches, adaptive=True)
    else:
        raise ConfigError(f"unknown pipeline {name!r}; choose from {[p.value for p in Pipeline]}")
    return replace(policy, strict_staleness=strict_staleness, straggler=straggler, max_regenerations=max_regenerations)
