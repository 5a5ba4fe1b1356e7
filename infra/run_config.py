"""A run described as YAML (`infra/configs/demo.yaml`): typed, documented, validated at start-up.

The `example` section names what is trained (tasks, agent, reward, warm-up data) by module path;
the other sections say how (sizes, layout, schedule) and know nothing of the example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infra.errors import InfraError
from infra.example import CALCULATOR, ExampleSection


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaSection(_Strict):
    nodes: Literal[1, 3] = Field(default=1, description="1 broker, or 3 (RF 3, min ISR 2).")


class ModelSection(_Strict):
    warmup_tasks: int = Field(default=2048, ge=1, description="Demonstrations the example's `warmup` writes.")
    warmup_steps: int = Field(default=1200, ge=0, description="Warm-up optimizer steps (0: start from random).")


class TasksSection(_Strict):
    count: int = Field(default=400, ge=1, description="Tasks the example's `tasks` generator writes.")
    seed: int = Field(default=7, description="Seed of the task generator (distinct from the warm-up's).")


class ResourceSection(_Strict):
    id: str = Field(min_length=1, description="Resource id.")
    cpus: tuple[int, ...] = Field(default=(), description="Cores the resource's processes may use.")
    capabilities: tuple[Literal["rollout", "train", "reference", "critic"], ...] = ("rollout",)


class InferenceSection(_Strict):
    max_running_requests: int = Field(default=32, ge=1)
    resources: tuple[ResourceSection, ...] = Field(min_length=1)


class SchedulerSection(_Strict):
    policy: Literal["colocated", "disaggregated", "spatiotemporal"] = "spatiotemporal"
    train_resources: int = Field(default=1, ge=1)
    train_batch_groups: int = Field(default=4, ge=1)
    samples_per_task: int = Field(default=4, ge=2, description="GRPO needs at least 2 samples per group.")
    max_staleness: int = Field(default=1, ge=0)


class TrainerSection(_Strict):
    learning_rate: float = Field(default=3e-4, gt=0)
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = Field(
        default="seq_mean_token_mean",
        description="Loss aggregation: per-session means keep long failed sessions from dominating a step.")


class AgentSection(_Strict):
    concurrency: int = Field(default=16, ge=1)
    max_turns: int = Field(default=3, ge=1)
    max_tokens: int = Field(default=80, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    ignore_eos: bool = Field(
        default=False,
        description="Every call generates its whole max_tokens (SGLang/vLLM extension, as serving benchmarks use): "
                    "long, fixed-length generations make rollout the bottleneck, as on real jobs.")


class RunSection(_Strict):
    max_steps: int = Field(default=12, ge=1, description="Stop after this many train steps.")
    max_minutes: float = Field(default=9.0, gt=0, description="Or after this much wall time.")
    max_restarts: int = Field(default=3, ge=0, description=(
        "A service that exits is restarted (each restarts from its own durable state, as after a kill), at most"
        " this many times per service; past that the run stops with an error."))
    tensorboard: bool = Field(default=True, description=(
        "Write the train metrics as TensorBoard event files under runs/<run>/tensorboard (infra/scalars.py)."))
    wandb_project: str | None = Field(default=None, min_length=1, description=(
        "Also log them to this W&B project when `wandb` is installed (None: no W&B)."))


class RunConfig(_Strict):
    name: str = Field(default="demo", pattern=r"^[A-Za-z0-9_-]+$")
    seed: int = 0
    example: ExampleSection = Field(default=CALCULATOR, description=(
        "What is trained: tasks, agent, reward, warm-up data (infra/example.py); default the calculator example."))
    kafka: KafkaSection = KafkaSection()
    model: ModelSection = ModelSection()
    tasks: TasksSection = TasksSection()
    inference: InferenceSection
    scheduler: SchedulerSection = SchedulerSection()
    trainer: TrainerSection = TrainerSection()
    agent: AgentSection = AgentSection()
    run: RunSection = RunSection()

    @model_validator(mode="after")
    def _warmup_has_data(self) -> RunConfig:
        if self.model.warmup_steps and self.example.warmup is None and self.example.warmup_file is None:
            raise ValueError(f"model.warmup_steps={self.model.warmup_steps} needs example.warmup or "
                             "example.warmup_file (or set it to 0)")
        return self

    @classmethod
    def load(cls, path: Path) -> RunConfig:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise InfraError(f"cannot read run config {path}: {e}") from e
        try:
            return cls.model_validate(data or {})
        except ValidationError as e:
            raise InfraError(f"invalid run config {path}:\n{e}") from e
