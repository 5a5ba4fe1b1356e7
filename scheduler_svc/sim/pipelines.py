"""The five pipelines of the paper's figure 4, each expressed as a tag policy of the one scheduler."""

from __future__ import annotations

from dataclasses import replace

from scheduler_svc.errors import ConfigError
from scheduler_svc.policies import TagPolicy, colocated, disaggregated, spatiotemporal

PIPELINES: tuple[str, ...] = (
    "colocated_sync",
    "disaggregated_naive",
    "microbatch",
    "offpolicy_fill",
    "spatiotemporal",
)

DESCRIPTIONS: dict[str, str] = {
    "colocated_sync": "verl-style: all devices roll out, then all train (on-policy)",
    "disaggregated_naive": "fixed train / rollout devices, rollout then train (on-policy)",
    "microbatch": "disaggregated, training starts on the first micro-batch (on-policy)",
    "offpolicy_fill": "disaggregated micro-batch pipeline filled with one-step off-policy rollouts",
    "spatiotemporal": "SeamlessFlow: train devices also roll out, preempted for each step (1-step async)",
}


def pipeline_policy(
    name: str,
    train_resources: int,
    microbatches: int,
    *,
    max_staleness: int | None = None,
    strict_staleness: bool = True,
    straggler: str = "wait",
    max_regenerations: int = 1,
) -> TagPolicy:
    """The pipeline's tag policy. The staleness knobs apply to every pipeline alike; for the
    synchronous ones (bound 0, batch dispatched whole) they change nothing. `max_staleness`
    overrides the asynchronous pipelines' bound (1)."""
    eta = 1 if max_staleness is None else max_staleness
    if name == "colocated_sync":
        policy = colocated(max_staleness=0)
    elif name == "disaggregated_naive":
        policy = disaggregated(train_resources, max_staleness=0)
    elif name == "microbatch":
        policy = disaggregated(train_resources, max_staleness=0, train_microbatches=microbatches)
    elif name == "offpolicy_fill":
        policy = disaggregated(train_resources, max_staleness=eta, train_microbatches=microbatches)
    elif name == "spatiotemporal":
        policy = spatiotemporal(train_resources, max_staleness=eta)
    else:
        raise ConfigError(f"unknown pipeline {name!r}; choose from {PIPELINES}")
    return replace(policy, strict_staleness=strict_staleness, straggler=straggler, max_regenerations=max_regenerations)
