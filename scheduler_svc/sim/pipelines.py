"""The five pipelines of the paper's figure 4, each expressed as a tag policy of the one scheduler."""

from __future__ import annotations

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


def pipeline_policy(name: str, train_resources: int, microbatches: int) -> TagPolicy:
    if name == "colocated_sync":
        return colocated(max_staleness=0)
    if name == "disaggregated_naive":
        return disaggregated(train_resources, max_staleness=0)
    if name == "microbatch":
        return disaggregated(train_resources, max_staleness=0, train_microbatches=microbatches)
    if name == "offpolicy_fill":
        return disaggregated(train_resources, max_staleness=1, train_microbatches=microbatches)
    if name == "spatiotemporal":
        return spatiotemporal(train_resources, max_staleness=1)
    raise ConfigError(f"unknown pipeline {name!r}; choose from {PIPELINES}")
