"""Configuration of the scheduler service (`python -m scheduler_svc`).

Validated at start-up: a bad value raises `ConfigError` whose message names the field and the value
(``train_batch_groups=0: Input should be greater than or equal to 1``). Kafka comes from `bus`
(default: `BusConfig.from_env`, i.e. SFLOW_BOOTSTRAP / SFLOW_TOPIC_PREFIX / SFLOW_REPLICATION).

Two kinds of fields:
* decision fields (`DECISION_FIELDS`: policy, settings, dataset, model, run id, ...) determine what
  the scheduler decides for a given input. They are written into every `SchedulerCheckpoint`, and a
  restart with different values is refused, because the journal of a run only rebuilds the same
  state under the same rules (start a new `run_id` to change them). `sflow replay scheduler` rebuilds
  a run from these recorded values alone.
* operational fields (bus, instance id, tick and snapshot intervals, state file, log level, metrics) may
  change between restarts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bus.config import BusConfig
from bus.errors import BusError
from bus.kit import MetricsHost, MetricsPort, describe_errors
from scheduler_svc.errors import ConfigError
from scheduler_svc.policies import PLACEMENTS, TagPolicy, colocated, disaggregated, spatiotemporal
from scheduler_svc.settings import SchedulerSettings

_RUN_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
DATASET_SUFFIXES = (".jsonl", ".json", ".ndjson", ".parquet", ".pq")

#: Fields that decide what the scheduler does with an input; fixed for the lifetime of a run.
DECISION_FIELDS: tuple[str, ...] = (
    "run_id",
    "policy",
    "train_resources",
    "max_staleness",
    "strict_staleness",
    "straggler",
    "max_regenerations",
    "train_microbatches",
    "placement",
    "with_critic",
    "train_batch_groups",
    "samples_per_task",
    "max_inflight_samples_per_resource",
    "heartbeat_timeout_s",
    "heartbeat_coalesce_s",
    "batch_timeout_s",
    "min_groups_on_timeout",
    "epochs",
    "group_timeout_s",
    "dynamic_sampling_extra_groups",
    "dataset",
    "dataset_id_field",
    "model",
    "initial_weights_uri",
)


class SchedulerServiceConfig(BaseModel):
    """What `python -m scheduler_svc` needs: the policy, its settings, the task dataset and Kafka."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    bus: BusConfig = Field(
        default_factory=lambda: BusConfig.from_env(client_id="scheduler"),
        description="Kafka (bootstrap servers, topic prefix); default from SFLOW_BOOTSTRAP / SFLOW_TOPIC_PREFIX.",
    )
    instance_id: str = Field(
        default="scheduler-0",
        min_length=1,
        description="Producer id of every event it writes, and its static consumer-group member id; keep it "
        "stable across restarts (events it produced itself are never read back as inputs).",
    )
    run_id: str = Field(
        default="run-0",
        description="Training run: names the journal, keys train events, and seeds the deterministic event ids.",
    )
    policy: Literal["colocated", "disaggregated", "spatiotemporal"] = Field(
        default="spatiotemporal",
        description="Tag layout: colocated (every resource trains and rolls out), disaggregated (k train-only "
        "resources), spatiotemporal (k resources train and roll out, the rest roll out).",
    )
    train_resources: int = Field(
        default=1, ge=1, description="k: resources that carry the train tag (disaggregated, spatiotemporal)."
    )
    max_staleness: int = Field(
        default=1, ge=0, description="Staleness bound: policy versions a trained group may lag (0 = on-policy)."
    )
    strict_staleness: bool = Field(
        default=True, description="Hold the bound for stragglers too (a step waits for groups about to expire)."
    )
    straggler: Literal["wait", "abort"] = Field(
        default="wait",
        description="A group still rolling out when the last step allowed to train on it closes: wait for it, "
        "or abort it (its sessions are cancelled; TaskCompleted with status aborted / dropped).",
    )
    max_regenerations: int = Field(
        default=1, ge=0, description="Times an aborted task is dispatched again (aborted: a straggler with "
        "straggler=abort, a group past group_timeout_s, or the groups of a step the trainer skipped as "
        "untrainable); then it is dropped (TaskCompleted status 'dropped')."
    )
    train_microbatches: int = Field(
        default=1, ge=1, description="Micro-batches a train step streams in (1: the whole batch at once)."
    )
    placement: Literal["train_priority", "registration_order"] = Field(
        default="train_priority", description="Which resources get the train tag: by roofline train_priority or "
        "in registration order."
    )
    with_critic: bool = Field(default=False, description="Train-capable resources also carry the critic tag (PPO).")
    train_batch_groups: int = Field(default=8, ge=1, description="B: GRPO groups (prompts) per train step.")
    dynamic_sampling_extra_groups: int = Field(
        default=0, ge=0, description="With the trainer's dynamic sampling: groups a step may take beyond B to make "
        "up for those it filters (zero reward variance), sized by the share filtered in recent steps (0: off)."
    )
    samples_per_task: int = Field(default=8, ge=1, description="n: samples per task (GRPO group size).")
    max_inflight_samples_per_resource: int = Field(
        default=64, ge=1, description="Samples the loader keeps in flight per serving rollout resource."
    )
    heartbeat_timeout_s: float = Field(
        default=30.0, gt=0, description="A resource silent for longer than this is declared lost."
    )
    heartbeat_coalesce_s: float | None = Field(
        default=None,
        ge=0,
        description="Heartbeats closer than this to the last recorded one are not journaled (None: "
        "heartbeat_timeout_s / 10); a resource is then lost after between timeout - coalesce and timeout.",
    )
    batch_timeout_s: float | None = Field(
        default=None, gt=0, description="Start a train step with fewer than B groups after this wait (None: never)."
    )
    min_groups_on_timeout: int = Field(default=1, ge=1, description="Fewest ready groups a timed-out step takes.")
    epochs: int = Field(default=1, ge=1, description="Passes over the task dataset.")
    group_timeout_s: float | None = Field(
        default=600.0, gt=0, description="A GRPO group whose samples have not all reported this long after its "
        "dispatch (a session whose end never arrived) is aborted: TaskCompleted status 'aborted' (dispatched "
        "again) or 'dropped' (after max_regenerations); the trainer drops it from its buffer (None: wait for ever)."
    )
    dataset: Path = Field(description="Task dataset: JSONL (one JSON object per line) or Parquet.")
    dataset_id_field: str = Field(
        default="task_id", min_length=1, description="Field holding a task's id (rows without it: row-<index>)."
    )
    model: str = Field(
        default="", description="Model name of the WeightsPublished events to follow ('' = any model)."
    )
    initial_weights_uri: str = Field(
        default="", description="uri sent in LoadWeights for version 0 (the weights engines start from)."
    )
    tick_interval_s: float = Field(
        default=1.0, gt=0, description="How often the clock is checked for heartbeat and batch timeouts."
    )
    snapshot_interval_s: float = Field(
        default=60.0, ge=0, description="Checkpoints carry the whole state at most this often (0: every one)."
    )
    state_file: Path | None = Field(
        default=None, description="Write the state JSON here whenever a checkpoint records it (None: never)."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level.")
    metrics_port: MetricsPort = Field(
        default=None, description="Serve the Prometheus series (bus.metrics) on this port (None: no metrics)."
    )
    metrics_host: MetricsHost = Field(default="127.0.0.1", description="Address the metrics port listens on.")

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        if not _RUN_ID.match(value):
            raise ValueError(f"run_id={value!r} must be 1-64 of [A-Za-z0-9._:-]")
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: Path) -> Path:
        if value.suffix.lower() not in DATASET_SUFFIXES:
            raise ValueError(f"dataset={str(value)!r} must end in one of {', '.join(DATASET_SUFFIXES)}")
        if not value.is_file():
            raise ValueError(f"dataset={str(value)!r} is not a file")
        return value.resolve()

    @model_validator(mode="after")
    def _core_accepts(self) -> SchedulerServiceConfig:
        if self.heartbeat_coalesce_s is not None and self.heartbeat_coalesce_s >= self.heartbeat_timeout_s:
            raise ValueError(
                f"heartbeat_coalesce_s={self.heartbeat_coalesce_s!r} must be < heartbeat_timeout_s="
                f"{self.heartbeat_timeout_s!r}"
            )
        self.tag_policy()
        self.settings()
        return self

    # ------------------------------------------------------------------------------------ derived

    def tag_policy(self) -> TagPolicy:
        if self.placement not in PLACEMENTS:  # pragma: no cover - Literal already checks it
            raise ConfigError(f"placement={self.placement!r}: must be one of {PLACEMENTS}")
        if self.policy == "colocated":
            policy = colocated(max_staleness=self.max_staleness, with_critic=self.with_critic)
        else:
            preset = disaggregated if self.policy == "disaggregated" else spatiotemporal
            policy = preset(
                self.train_resources,
                max_staleness=self.max_staleness,
                train_microbatches=self.train_microbatches,
                with_critic=self.with_critic,
                placement=self.placement,
            )
        return dataclasses.replace(policy, strict_staleness=self.strict_staleness, straggler=self.straggler,
                                   max_regenerations=self.max_regenerations)

    def settings(self) -> SchedulerSettings:
        return SchedulerSettings(
            train_batch_groups=self.train_batch_groups,
            samples_per_task=self.samples_per_task,
            max_inflight_samples_per_resource=self.max_inflight_samples_per_resource,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            batch_timeout_s=self.batch_timeout_s,
            min_groups_on_timeout=self.min_groups_on_timeout,
            epochs=self.epochs,
            group_timeout_s=self.group_timeout_s,
            dynamic_sampling_extra_groups=self.dynamic_sampling_extra_groups,
        )

    @property
    def coalesce_s(self) -> float:
        return self.heartbeat_timeout_s / 10 if self.heartbeat_coalesce_s is None else self.heartbeat_coalesce_s

    @cached_property
    def dataset_sha256(self) -> str:
        try:
            return hashlib.sha256(self.dataset.read_bytes()).hexdigest()
        except OSError as e:
            raise ConfigError(f"dataset={str(self.dataset)!r} cannot be read: {e}") from e

    def decision_config(self) -> dict[str, Any]:
        """The decision fields as plain JSON values, plus the dataset's digest (written in checkpoints)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in DECISION_FIELDS}
        out["dataset"] = str(self.dataset)
        out["dataset_sha256"] = self.dataset_sha256
        return out

    def decision_differences(self, recorded: Mapping[str, Any]) -> list[str]:
        """'field: recorded X, now Y' for every decision field that differs from a recorded config (the
        dataset by content: a moved file with the same sha256 is the same dataset)."""
        mine = self.decision_config()
        return [
            f"{name}: recorded {self._recorded(recorded, name)!r}, now {mine.get(name)!r}"
            for name in sorted(set(mine) | set(recorded))
            if name != "dataset" and self._recorded(recorded, name) != mine.get(name)
        ]

    @classmethod
    def _recorded(cls, recorded: Mapping[str, Any], name: str) -> Any:
        """A recorded decision field; one added after the record was written counts as its default."""
        field = cls.model_fields.get(name)
        return recorded.get(name, None if field is None or name in recorded else field.default)

    # ------------------------------------------------------------------------------------ building

    @classmethod
    def build(cls, **values: Any) -> SchedulerServiceConfig:
        """Validated config; raises `ConfigError` naming every bad field and its value."""
        try:
            return cls(**values)
        except ValidationError as e:
            raise ConfigError(describe_errors(e)) from e
        except BusError as e:
            raise ConfigError(f"bus: {e}") from e

    @classmethod
    def from_decision_config(cls, recorded: Mapping[str, Any], **overrides: Any) -> SchedulerServiceConfig:
        """The config a run was recorded with (from a checkpoint), with operational `overrides`."""
        values = {k: v for k, v in recorded.items() if k in DECISION_FIELDS}
        values.update(overrides)
        return cls.build(**values)

