"""Trainer configuration: strict pydantic models (`bus.kit.ConfigModel`) checked on construction.

`TrainerConfig` (with `EngineConfig` and `AlgorithmConfig`) configures the core; `ServiceConfig` adds what
the service shell needs (run id, resources, weights store, bus, trigger mode) and holds the other two.
Every bad value raises `ConfigError` naming the field (dotted, e.g. `engine.zero_stage`) and the value, so
a typo in a YAML file fails at start-up, not after the model was loaded. `TrainerConfig.from_mapping` and
`ServiceConfig.from_mapping` build the whole tree from plain dicts (YAML / JSON) and refuse unknown keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from bus.config import BusConfig
from bus.kit import ConfigModel, MetricsHost, MetricsPort
from trainer_svc.errors import ConfigError

Precision = Literal["fp32", "bf16"]
Device = Literal["auto", "cpu", "cuda"]
AttnImplementation = Literal["sdpa", "eager"]
OptimizerName = Literal["adamw", "cpu_adam"]
Algorithm = Literal["grpo", "ppo"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
ImportanceWeightMode = Literal["clip", "mask"]
RatioLevel = Literal["token", "sequence"]
KlEstimator = Literal["k1", "k3"]


class _Section(ConfigModel):
    config_error: ClassVar[type[Exception]] = ConfigError


class EngineConfig(_Section):
    """How the model is trained: DeepSpeed, precision, batching and the optimizer."""

    field_prefix: ClassVar[str] = "engine."

    zero_stage: Literal[0, 1, 2] = 0
    """DeepSpeed ZeRO stage 0, 1 or 2 (3 would shard weights and need a gather for every HF save)."""
    precision: Precision = "fp32"
    """fp32, or bf16 weights and activations with fp32 master weights kept by DeepSpeed."""
    device: Device = "auto"
    """cpu (gloo, DeepSpeed's CPU accelerator), cuda (nccl), or auto: cuda when torch sees a GPU."""
    micro_batch_tokens: int = Field(default=4096, ge=1)
    """Token budget of one micro-batch: whole session trees are packed into it (a larger tree gets its own)."""
    gradient_accumulation_steps: int = Field(default=0, ge=0)
    """Micro-batches per optimizer update; 0 = every micro-batch of a train step in one update."""
    optimizer: OptimizerName = "adamw"
    """adamw: torch.optim.AdamW; cpu_adam: DeepSpeed's vectorised CPU Adam(W) (JIT-built on first use)."""
    learning_rate: float = Field(default=1e-5, gt=0)
    """AdamW learning rate (constant)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay."""
    adam_beta1: float = Field(default=0.9, ge=0, le=1)
    """AdamW first-moment decay."""
    adam_beta2: float = Field(default=0.999, ge=0, le=1)
    """AdamW second-moment decay."""
    adam_eps: float = Field(default=1e-8, gt=0)
    """AdamW epsilon."""
    grad_clip: float = Field(default=1.0, ge=0)
    """Global gradient-norm clip; 0 disables it."""
    attn_implementation: AttnImplementation = "sdpa"
    """transformers attention backend; both take the tree mask as a 4D additive float mask."""
    seed: int = Field(default=0, ge=0)
    """Seed of torch's RNG at engine start (weights come from the model directory, not from it)."""



class AlgorithmConfig(_Section):
    """What is optimised: GRPO (group baseline) or PPO (critic + GAE), both with the decoupled objective."""

    field_prefix: ClassVar[str] = "algorithm."

    algorithm: Algorithm = "grpo"
    """grpo: advantage = group-normalised session reward; ppo: GAE over a learned critic's token values."""
    normalize_std: bool = True
    """GRPO: divide by the group's reward std (False = Dr. GRPO, mean-centred only)."""
    aggregation: Aggregation = "token_mean"
    """How token losses become one number (verl's `loss_agg_mode`; its spellings with '-' are accepted):
    token_mean over all tokens of an update (DAPO; no length bias), seq_mean_token_mean (mean per session,
    then over sessions: GRPO's original, which penalises a long wrong answer less per token than a short
    one, so lengths can run away), seq_mean_token_sum (sum per session, mean over sessions), or
    seq_mean_token_sum_norm (Dr. GRPO: the per-session sum divided by the constant `aggregation_constant`,
    mean over sessions: every token weighs the same whatever its session's length or the step's)."""
    aggregation_constant: float | None = Field(default=None, gt=0)
    """seq_mean_token_sum_norm: Dr. GRPO's constant normaliser, typically the max response length (the
    agent's max_tokens); required by that mode, unused by the others."""
    clip_eps: float = Field(default=0.2, gt=0, le=1)
    """PPO clip on current/proximal ratio, lower side (and upper unless clip_eps_high is set)."""
    clip_eps_high: float | None = Field(default=None, gt=0)
    """Upper clip (DAPO's clip-higher, e.g. 0.28 with clip_eps 0.2: a low-probability token that helped
    can grow further, which keeps entropy from collapsing); None = clip_eps. The step reports the
    fraction clipped at each side (`clip_fraction_low`, `clip_fraction_high`)."""
    ratio_level: RatioLevel = "token"
    """token: PPO's per-token ratio; sequence: GSPO's sequence ratio (geometric mean of a session's token
    ratios, clipped per session), for when token ratios are too noisy (long answers, MoE routing); GSPO
    clips far tighter (clip_eps ~ 3e-4, clip_eps_high ~ 4e-4) and pairs with seq_mean_token_mean."""
    dual_clip: float | None = Field(default=None, gt=1)
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens; None disables it."""
    iw_cap: float | None = Field(default=5.0, ge=1)
    """Cap on the behaviour importance weight proximal/behaviour; None = uncapped."""
    iw_mode: ImportanceWeightMode = "clip"
    """clip: weights above iw_cap are truncated to it; mask: such tokens are dropped (AReaL)."""
    max_staleness: int | None = Field(default=8, ge=0)
    """Generated tokens with current_version - token_version > max_staleness are masked; None = no bound."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the KL to the reference (the initial weights); > 0 keeps a frozen reference copy."""
    kl_estimator: KlEstimator = "k3"
    """Per-token KL estimate (Schulman's k1/k3): k3 = e^(ref-logp) - (ref-logp) - 1 (GRPO's, >= 0, low
    variance: the one to penalise with); k1 = logp - ref (verl's `kl`: unbiased value, but as a loss its
    gradient vanishes in expectation on-policy; for comparing with runs that used it)."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of an entropy bonus (loss -= coef * aggregated token entropy), for when entropy collapses
    and exploration stops; 0 = none (DAPO uses none and clip-higher instead). Entropy is reported anyway."""
    max_response_tokens: int | None = Field(default=None, ge=1)
    """The agent's max_tokens: a call whose output has this many generated tokens was truncated
    (finish_reason length). Needed by overlong_mask and overlong_buffer; None = truncation unknown."""
    overlong_mask: bool = False
    """DAPO's overlong filtering: truncated sessions get no loss (they still count in their group's
    baseline), so a cut-off answer is not taught as wrong for its length alone."""
    overlong_buffer: int | None = Field(default=None, ge=1)
    """DAPO's soft overlong punishment: a call output longer than max_response_tokens - buffer loses
    up to `overlong_penalty` of reward, linearly over the buffer (all of it when truncated); None = off."""
    overlong_penalty: float = Field(default=1.0, gt=0)
    """Largest reward a too-long session loses under overlong_buffer (DAPO: 1)."""
    ppo_epochs: int = Field(default=1, ge=1)
    """Passes over a train step's data; > 1 makes the proximal policy differ from the current one."""
    gamma: float = Field(default=1.0, ge=0, le=1)
    """PPO: discount over generated tokens."""
    lam: float = Field(default=1.0, ge=0, le=1)
    """PPO: GAE lambda."""
    normalize_advantages: bool = True
    """PPO: whiten the GAE advantages over the update's trainable tokens."""
    value_clip: float | None = Field(default=0.2, gt=0)
    """PPO: clip of the new value around the value before the update; None disables it."""
    critic_learning_rate: float = Field(default=1e-5, gt=0)
    """PPO: AdamW learning rate of the critic."""
    skip_statuses: tuple[str, ...] = Field(default=("aborted",), strict=False)  # a YAML list is a tuple
    """Session statuses not trained on (an aborted session's reward means nothing)."""
    max_abs_reward: float = Field(default=1e6, gt=0)
    """Largest |reward| a step accepts. A NaN, an infinity or a reward beyond it refuses the whole step
    (`NonFiniteError`, no weight changes): refused, never clamped, because a reward that large is a bug
    upstream and a clamped one would still be trained on as if it meant something. 1e6 keeps every GRPO
    statistic (squared deviations: 1e12) far inside float32."""
    min_group_members: int = Field(default=2, ge=1)
    """GRPO: a group with fewer usable members (tokens to train on, status not skipped) is dropped and
    reported: a lone member is its own baseline, its advantage is 0. Members without tokens (failed
    sessions, empty trajectories) still complete their group but are not part of its baseline."""
    drop_zero_variance_groups: bool = False
    """GRPO: a group whose usable members all have the same reward is dropped and reported (its
    advantages are all 0: it would only dilute the loss of the others). Off by default: a policy that
    fails every task gives only such groups, and with the rule on every step would be skipped and
    re-planned without end (seen in the 3-broker fault test); dynamic sampling that refills such steps
    from the stream is what makes it safe to turn on."""

    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (verl's `algorithm.filter_groups.enable`, off there too; it is off here so a
    recipe changes only when asked): a complete group whose usable members all have one reward is filtered
    out before the step (done, never trained, listed in `filtered_group_ids`) and is not counted as one of
    the step's groups; the step takes further complete groups from the stream in its place. Standalone:
    the step waits until it has `groups_per_step` groups with reward variance. Scheduled: the assigned
    zero-variance groups are filtered and complete groups no assignment names are added in their place
    (`added_group_ids`: the scheduler counts them consumed and hands them to no later step; with its
    `dynamic_sampling_extra_groups` it also sizes later steps, and the rollout it dispatches, by the share
    filtered); when every assigned group has zero variance and none can be added, the step trains on the
    assigned groups as they are (a skip would be planned again without end)."""
    dynamic_sampling_max_filtered: int = Field(default=16, ge=1)
    """Dynamic sampling's bound (verl's `max_num_gen_batches`, counted in groups): standalone, once this
    many zero-variance groups are buffered the step trains on the groups with variance found so far, or,
    with none, is skipped and reported (status skipped, the filtered groups in dropped_group_ids);
    scheduled, at most this many groups are added to one step."""

    @field_validator("aggregation", mode="before")
    @classmethod
    def _verl_spelling(cls, value: object) -> object:
        return value.replace("-", "_") if isinstance(value, str) else value

    @model_validator(mode="after")
    def _needs(self) -> AlgorithmConfig:
        if self.aggregation == "seq_mean_token_sum_norm" and self.aggregation_constant is None:
            raise ValueError(f"aggregation={self.aggregation!r} needs aggregation_constant (e.g. max_tokens)")
        uses_length = self.overlong_mask or self.overlong_buffer is not None
        if uses_length and self.max_response_tokens is None:
            raise ValueError(f"overlong_mask={self.overlong_mask!r}, overlong_buffer={self.overlong_buffer!r}: "
                             "need max_response_tokens")
        if self.overlong_buffer is not None and self.overlong_buffer >= (self.max_response_tokens or 0):
            raise ValueError(f"overlong_buffer={self.overlong_buffer!r}: must be below max_response_tokens="
                             f"{self.max_response_tokens!r}")
        return self



class CollapseGuardConfig(_Section):
    """When the run says it is collapsing (`trainer_svc.collapse_guard`): every signal must hold on each of
    the last `window` completed steps; the relative ones compare with the first `window` steps of the run."""

    field_prefix: ClassVar[str] = "collapse_guard."

    enabled: bool = True
    """Check every completed step (a warning log and `TrainStepCompleted.collapse_signals`; training goes on)."""
    window: int = Field(default=3, ge=1)
    """Consecutive completed steps a signal must hold on (and the size of the baseline at the start)."""
    max_truncated_fraction: float = Field(default=0.5, gt=0, le=1)
    """length_runaway: at least this share of the step's sessions cut off at max_response_tokens."""
    max_length_fraction: float = Field(default=0.9, gt=0, le=1)
    """length_runaway: mean call output length at least this share of algorithm.max_response_tokens."""
    max_length_growth: float = Field(default=3.0, gt=1)
    """length_runaway: mean call output length at least this multiple of the first steps' (without a limit)."""
    min_entropy_ratio: float = Field(default=0.2, gt=0, lt=1)
    """entropy_collapse: token entropy at most this share of the first steps' (sampling became greedy)."""
    max_entropy_ratio: float = Field(default=3.0, gt=1)
    """entropy_explosion: token entropy at least this multiple of the first steps' (the policy turned to noise)."""
    max_zero_variance_fraction: float = Field(default=1.0, gt=0, le=1)
    """zero_variance: at least this share of the step's groups had one reward (no GRPO gradient left)."""
    converged_reward: float | None = None
    """The mean reward of a policy that solves its tasks (None: unknown). While the window's steps reach it
    on average (the reward of every session they saw, dynamic sampling's filtered ones included),
    entropy_collapse and zero_variance are not signalled: a policy that solves its tasks is greedy and its
    groups agree, which is convergence. Length runaway and entropy explosion still are."""


class TrainerConfig(_Section):
    """The trainer: which model, how it is trained, what is optimised."""

    model_path: str
    """Hugging Face model directory (config.json, safetensors, tokenizer) the policy starts from."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """DeepSpeed, precision, batching, optimizer."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Loss and advantage estimator."""

    @field_validator("model_path")
    @classmethod
    def _model_dir(cls, value: str) -> str:
        return _model_dir("model_path", value)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TrainerConfig:
        """Builds the config from plain dicts (parsed YAML/JSON); unknown keys are errors."""
        return cls(**_mapping("config", data))


def _mapping(name: str, data: object) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{name}={data!r}: must be a mapping")
    return dict(data)


def _model_dir(name: str, value: str) -> str:
    if not value:
        raise ValueError(f"{name}={value!r}: must be a non-empty path string")
    if not (Path(value) / "config.json").is_file():
        raise ValueError(f"{name}={value!r}: must be a model directory holding config.json")
    return value


# --- the service shell -------------------------------------------------------------------------

ServiceMode = Literal["scheduled", "standalone"]
_RUN_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class ServiceConfig(_Section):
    """The trainer service (`python -m trainer_svc`): which run it trains, when it steps, where weights go.

    `from_mapping` reads it from plain dicts (a YAML/JSON file); the bus settings are not part of the
    file but come from the environment (`BusConfig.from_env`) or the CLI.
    """

    run_id: str
    """Run id, 1-64 of [A-Za-z0-9._:-]: names the checkpoint folder, keys the `train` events and must
    equal the scheduler's run id (it ignores TrainStepCompleted of other runs)."""
    base_model_dir: str
    """Hugging Face model directory the policy starts from (version 0); later versions come from checkpoints."""
    weights_root: str
    """Weights store: checkpoints go to `<weights_root>/<run_id>/v<version>`, one directory per version."""
    resource_ids: tuple[Annotated[str, Field(min_length=1)], ...] = Field(default=("trainer-0",), min_length=1,
                                                                          strict=False)
    """Resources this trainer runs on; a train `Assignment` naming any of them is this trainer's."""
    model_name: str = ""
    """`model` of the WeightsPublished events (the key of `weights`); '' = the base model directory's name."""
    mode: ServiceMode = "scheduled"
    """scheduled: train when the scheduler assigns a step (Assignment + TrainData); standalone: train
    whenever `groups_per_step` complete groups (BatchReady) are buffered, no scheduler needed."""
    groups_per_step: int = Field(default=1, ge=1)
    """standalone mode: complete groups per train step."""
    max_staleness: int | None = Field(default=None, ge=0)
    """Staleness bound in policy versions; None = `algorithm.max_staleness`. Overrides that field (tokens
    older than the bound are masked in the loss) and drops buffered groups whose newest token is older."""
    group_wait_s: float = Field(default=60.0, ge=0)
    """scheduled mode: how long a step waits for assigned groups that have not arrived before it trains on
    what is there (the missing ones are logged)."""
    poll_timeout_s: float = Field(default=0.5, gt=0)
    """Longest wait for new events in one poll (bounds how late a timeout or a stop request is seen)."""
    dedupe_steps: int = Field(default=64, ge=0)
    """Trained trajectory and group ids of this many recent steps stay in the checkpoint, besides those a
    restart will re-read, so a late duplicate (an at-least-once re-publish) is still recognised."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of the process."""
    metrics_port: MetricsPort = None
    """Serve the Prometheus series (`bus.metrics`: step time, loss, reward, ...) on this port (None: no metrics)."""
    metrics_host: MetricsHost = "127.0.0.1"
    """Address the metrics port listens on."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """DeepSpeed, precision, batching, optimizer."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Loss and advantage estimator."""
    collapse_guard: CollapseGuardConfig = Field(default_factory=CollapseGuardConfig)
    """When the run warns that response length or entropy runs away (thresholds)."""
    bus: BusConfig = Field(default_factory=lambda: BusConfig.from_env(client_id="trainer"))
    """Kafka settings (SFLOW_BOOTSTRAP, SFLOW_TOPIC_PREFIX, SFLOW_REPLICATION by default)."""

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        if not _RUN_ID.match(value):
            raise ValueError(f"run_id={value!r}: must be 1-64 of [A-Za-z0-9._:-]")
        return value

    @field_validator("base_model_dir")
    @classmethod
    def _base_model_dir(cls, value: str) -> str:
        return _model_dir("base_model_dir", value)

    @field_validator("weights_root")
    @classmethod
    def _weights_root(cls, value: str) -> str:
        if not value:
            raise ValueError(f"weights_root={value!r}: must be a non-empty path string")
        return value

    @property
    def model(self) -> str:
        """The model name WeightsPublished carries."""
        return self.model_name or Path(self.base_model_dir).resolve().name

    @property
    def staleness_bound(self) -> int | None:
        return self.algorithm.max_staleness if self.max_staleness is None else self.max_staleness

    @property
    def checkpoint_root(self) -> Path:
        """Where this run's checkpoints live (`latest_checkpoint` looks here)."""
        return Path(self.weights_root) / self.run_id

    def trainer_config(self) -> TrainerConfig:
        """The core's config: the base model, the engine, the algorithm with the service's staleness bound."""
        algorithm = self.algorithm.model_copy(update={"max_staleness": self.staleness_bound})
        return TrainerConfig(model_path=self.base_model_dir, engine=self.engine, algorithm=algorithm)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, bus: BusConfig | None = None) -> ServiceConfig:
        """Builds the config from plain dicts (parsed YAML/JSON); unknown keys are errors."""
        values = _mapping("config", data)
        if "bus" in values:
            raise ConfigError(f"bus={values['bus']!r}: unknown field (the bus comes from the environment or flags)")
        if isinstance(values.get("resource_ids"), str):
            values["resource_ids"] = tuple(values["resource_ids"].split(","))
        if bus is not None:
            values["bus"] = bus
        return cls(**values)
