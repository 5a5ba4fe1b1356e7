"""Knobs of the scheduler core (the service shell's config maps onto this)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_svc.errors import ConfigError


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    #: B: GRPO groups (prompts) per train step.
    train_batch_groups: int
    #: n: samples per prompt (group size).
    samples_per_task: int
    #: Rollout capacity: samples the loader keeps in flight per serving rollout resource (agentic
    #: workloads oversubscribe engines because sessions spend time in tools).
    max_inflight_samples_per_resource: int = 64
    #: A resource silent for longer than this (checked on Tick) is lost.
    heartbeat_timeout_s: float = 30.0
    #: Start a train step with fewer than B groups once the trainer has waited this long (None: never).
    batch_timeout_s: float | None = None
    #: Fewest ready groups a timeout-triggered step trains on.
    min_groups_on_timeout: int = 1
    #: Passes over the task dataset.
    epochs: int = 1
    #: A group still rolling out this long after its dispatch (some member never reported) is aborted:
    #: dispatched again within the policy's max_regenerations, else dropped (None: wait for ever).
    group_timeout_s: float | None = None
    #: Adaptive lending (policy.adaptive): the core's prior for a resource's switch from rollout into
    #: training, which it cannot observe (the trainer does it before its first micro-batch).
    switch_estimate_s: float = 4.0
    #: Dynamic sampling (the trainer's `algorithm.dynamic_sampling`): groups a step may take beyond B to
    #: make up for the zero-variance groups the trainer filters, sized by the share it filtered in the
    #: recent steps (0: off, every step takes B).
    dynamic_sampling_extra_groups: int = 0
    #: Adaptive lending: context tokens per engine whose KV cache takes as long to read per decode
    #: iteration as the model's weights (weight bytes / KV bytes per token: about 111K for an 8B model
    #: with 8 KV heads of 128 over 36 layers in bf16). It prices what one more engine brings when the
    #: staleness budget, not the engines' slots, bounds how many requests run (see
    #: `scheduler_svc.lending.lend_value_share`); None: a lent engine is counted as a whole engine.
    kv_balance_tokens: float | None = None

    def __post_init__(self) -> None:
        for name in ("train_batch_groups", "samples_per_task", "max_inflight_samples_per_resource"):
            if getattr(self, name) < 1:
                raise ConfigError(f"SchedulerSettings.{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.heartbeat_timeout_s > 0:
            raise ConfigError(f"SchedulerSettings.heartbeat_timeout_s must be > 0, got {self.heartbeat_timeout_s!r}")
        if self.batch_timeout_s is not None and not self.batch_timeout_s > 0:
            raise ConfigError(f"SchedulerSettings.batch_timeout_s must be > 0 or None, got {self.batch_timeout_s!r}")
        if self.min_groups_on_timeout < 1:
            raise ConfigError(
                f"SchedulerSettings.min_groups_on_timeout must be >= 1, got {self.min_groups_on_timeout!r}"
            )
        if self.group_timeout_s is not None and not self.group_timeout_s > 0:
            raise ConfigError(f"SchedulerSettings.group_timeout_s must be > 0 or None, got {self.group_timeout_s!r}")
        if self.switch_estimate_s < 0:
            raise ConfigError(f"SchedulerSettings.switch_estimate_s must be >= 0, got {self.switch_estimate_s!r}")
        if self.dynamic_sampling_extra_groups < 0:
            raise ConfigError("SchedulerSettings.dynamic_sampling_extra_groups must be >= 0, got "
                              f"{self.dynamic_sampling_extra_groups!r}")
        if self.kv_balance_tokens is not None and not self.kv_balance_tokens > 0:
            raise ConfigError(
                f"SchedulerSettings.kv_balance_tokens must be > 0 or None, got {self.kv_balance_tokens!r}"
            )
        if self.epochs < 1:
            raise ConfigError(f"SchedulerSettings.epochs must be >= 1, got {self.epochs!r}")
