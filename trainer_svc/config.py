"""Trainer configuration: frozen dataclasses checked on construction.

`TrainerConfig` (with `EngineConfig` and `AlgorithmConfig`) configures the core; `ServiceConfig` adds what
the service shell needs (run id, resources, weights store, bus, trigger mode) and holds the other two.
Every bad value raises `ConfigError` naming the field (dotted, e.g. `engine.zero_stage`) and the value, so
a typo in a YAML file fails at start-up, not after the model was loaded. `TrainerConfig.from_mapping` and
`ServiceConfig.from_mapping` build the whole tree from plain dicts (YAML / JSON) and refuse unknown keys.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from bus.config import BusConfig
from trainer_svc.errors import ConfigError

Precision = Literal["fp32", "bf16"]
Device = Literal["auto", "cpu", "cuda"]
AttnImplementation = Literal["sdpa", "eager"]
OptimizerName = Literal["adamw", "cpu_adam"]
Algorithm = Literal["grpo", "ppo"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
ImportanceWeightMode = Literal["clip", "mask"]

C = TypeVar("C")


def _fail(name: str, value: object, rule: str) -> ConfigError:
    return ConfigError(f"{name}={value!r}: {rule}")


def _check_choice(name: str, value: object, choices: tuple[object, ...]) -> None:
    if value not in choices:
        raise _fail(name, value, f"must be one of {', '.join(map(repr, choices))}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _fail(name, value, "must be true or false")


def _check_number(
    name: str, value: object, *, low: float | None = None, high: float | None = None,
    low_open: bool = False, integer: bool = False,
) -> None:
    wrong_kind = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if wrong_kind or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(name, value, "must be a finite " + ("integer" if integer else "number"))
    if low is not None and (value <= low if low_open else value < low):
        raise _fail(name, value, f"must be {'>' if low_open else '>='} {low}")
    if high is not None and value > high:
        raise _fail(name, value, f"must be <= {high}")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How the model is trained: DeepSpeed, precision, batching and the optimizer."""

    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0, 1 or 2 (3 would shard weights and need a gather for every HF save)."""
    precision: Precision = "fp32"
    """fp32, or bf16 weights and activations with fp32 master weights kept by DeepSpeed."""
    device: Device = "auto"
    """cpu (gloo, DeepSpeed's CPU accelerator), cuda (nccl), or auto: cuda when torch sees a GPU."""
    micro_batch_tokens: int = 4096
    """Token budget of one micro-batch: whole session trees are packed into it (a larger tree gets its own)."""
    gradient_accumulation_steps: int = 0
    """Micro-batches per optimizer update; 0 = every micro-batch of a train step in one update."""
    optimizer: OptimizerName = "adamw"
    """adamw: torch.optim.AdamW; cpu_adam: DeepSpeed's vectorised CPU Adam(W) (JIT-built on first use)."""
    learning_rate: float = 1e-5
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    adam_beta1: float = 0.9
    """AdamW first-moment decay."""
    adam_beta2: float = 0.999
    """AdamW second-moment decay."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables it."""
    attn_implementation: AttnImplementation = "sdpa"
    """transformers attention backend; both take the tree mask as a 4D additive float mask."""
    seed: int = 0
    """Seed of torch's RNG at engine start (weights come from the model directory, not from it)."""

    def __post_init__(self) -> None:
        _check_choice("engine.zero_stage", self.zero_stage, (0, 1, 2))
        _check_choice("engine.precision", self.precision, get_args(Precision))
        _check_choice("engine.device", self.device, get_args(Device))
        _check_number("engine.micro_batch_tokens", self.micro_batch_tokens, low=1, integer=True)
        _check_number("engine.gradient_accumulation_steps", self.gradient_accumulation_steps, low=0, integer=True)
        _check_choice("engine.optimizer", self.optimizer, get_args(OptimizerName))
        _check_number("engine.learning_rate", self.learning_rate, low=0, low_open=True)
        _check_number("engine.weight_decay", self.weight_decay, low=0)
        _check_number("engine.adam_beta1", self.adam_beta1, low=0, high=1)
        _check_number("engine.adam_beta2", self.adam_beta2, low=0, high=1)
        _check_number("engine.adam_eps", self.adam_eps, low=0, low_open=True)
        _check_number("engine.grad_clip", self.grad_clip, low=0)
        _check_choice("engine.attn_implementation", self.attn_implementation, get_args(AttnImplementation))
        _check_number("engine.seed", self.seed, low=0, integer=True)


@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
    """What is optimised: GRPO (group baseline) or PPO (critic + GAE), both with the decoupled objective."""

    algorithm: Algorithm = "grpo"
    """grpo: advantage = group-normalised session reward; ppo: GAE over a learned critic's token values."""
    normalize_std: bool = True
    """GRPO: divide by the group's reward std (False = Dr. GRPO, mean-centred only)."""
    aggregation: Aggregation = "token_mean"
    """How token losses become one number: token_mean over all tokens of an update, seq_mean_token_mean
    (mean per session, then over sessions), or seq_mean_token_sum (sum per session, mean over sessions)."""
    clip_eps: float = 0.2
    """PPO clip on current/proximal ratio, lower side (and upper unless clip_eps_high is set)."""
    clip_eps_high: float | None = None
    """Upper clip (DAPO's clip-higher); None = clip_eps."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens; None disables it."""
    iw_cap: float | None = 5.0
    """Cap on the behaviour importance weight proximal/behaviour; None = uncapped."""
    iw_mode: ImportanceWeightMode = "clip"
    """clip: weights above iw_cap are truncated to it; mask: such tokens are dropped (AReaL)."""
    max_staleness: int | None = 8
    """Generated tokens with current_version - token_version > max_staleness are masked; None = no bound."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the reference (the initial weights); > 0 keeps a frozen reference copy."""
    ppo_epochs: int = 1
    """Passes over a train step's data; > 1 makes the proximal policy differ from the current one."""
    gamma: float = 1.0
    """PPO: discount over generated tokens."""
    lam: float = 1.0
    """PPO: GAE lambda."""
    normalize_advantages: bool = True
    """PPO: whiten the GAE advantages over the update's trainable tokens."""
    value_clip: float | None = 0.2
    """PPO: clip of the new value around the value before the update; None disables it."""
    critic_learning_rate: float = 1e-5
    """PPO: AdamW learning rate of the critic."""
    skip_statuses: tuple[str, ...] = ("aborted",)
    """Session statuses not trained on (an aborted session's reward means nothing)."""
    max_abs_reward: float = 1e6
    """Largest |reward| a step accepts. A NaN, an infinity or a reward beyond it refuses the whole step
    (`NonFiniteError`, no weight changes): refused, never clamped, because a reward that large is a bug
    upstream and a clamped one would still be trained on as if it meant something. 1e6 keeps every GRPO
    statistic (squared deviations: 1e12) far inside float32."""
    min_group_members: int = 2
    """GRPO: a group with fewer usable members (tokens to train on, status not skipped) is dropped and
    reported: a lone member is its own baseline, its advantage is 0. Members without tokens (failed
    sessions, empty trajectories) still complete their group but are not part of its baseline."""
    drop_zero_variance_groups: bool = False
    """GRPO: a group whose usable members all have the same reward is dropped and reported (its
    advantages are all 0: it would only dilute the loss of the others). Off by default: a policy that
    fails every task gives only such groups, and with the rule on every step would be skipped and
    re-planned without end (seen in the 3-broker fault test); dynamic sampling that refills such steps
    from the stream is what makes it safe to turn on."""

    def __post_init__(self) -> None:
        _check_choice("algorithm.algorithm", self.algorithm, get_args(Algorithm))
        _check_bool("algorithm.normalize_std", self.normalize_std)
        _check_bool("algorithm.normalize_advantages", self.normalize_advantages)
        _check_choice("algorithm.aggregation", self.aggregation, get_args(Aggregation))
        _check_number("algorithm.clip_eps", self.clip_eps, low=0, low_open=True, high=1)
        if self.clip_eps_high is not None:
            _check_number("algorithm.clip_eps_high", self.clip_eps_high, low=0, low_open=True)
        if self.dual_clip is not None:
            _check_number("algorithm.dual_clip", self.dual_clip, low=1, low_open=True)
        if self.iw_cap is not None:
            _check_number("algorithm.iw_cap", self.iw_cap, low=1)
        _check_choice("algorithm.iw_mode", self.iw_mode, get_args(ImportanceWeightMode))
        if self.max_staleness is not None:
            _check_number("algorithm.max_staleness", self.max_staleness, low=0, integer=True)
        _check_number("algorithm.kl_coef", self.kl_coef, low=0)
        _check_number("algorithm.ppo_epochs", self.ppo_epochs, low=1, integer=True)
        _check_number("algorithm.gamma", self.gamma, low=0, high=1)
        _check_number("algorithm.lam", self.lam, low=0, high=1)
        if self.value_clip is not None:
            _check_number("algorithm.value_clip", self.value_clip, low=0, low_open=True)
        _check_number("algorithm.critic_learning_rate", self.critic_learning_rate, low=0, low_open=True)
        _check_number("algorithm.max_abs_reward", self.max_abs_reward, low=0, low_open=True)
        _check_number("algorithm.min_group_members", self.min_group_members, low=1, integer=True)
        _check_bool("algorithm.drop_zero_variance_groups", self.drop_zero_variance_groups)
        if not isinstance(self.skip_statuses, tuple) or not all(isinstance(s, str) for s in self.skip_statuses):
            raise _fail("algorithm.skip_statuses", self.skip_statuses, "must be a tuple of strings")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """The trainer: which model, how it is trained, what is optimised."""

    model_path: str
    """Hugging Face model directory (config.json, safetensors, tokenizer) the policy starts from."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """DeepSpeed, precision, batching, optimizer."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Loss and advantage estimator."""

    def __post_init__(self) -> None:
        if not isinstance(self.model_path, str) or not self.model_path:
            raise _fail("model_path", self.model_path, "must be a non-empty path string")
        if not (Path(self.model_path) / "config.json").is_file():
            raise _fail("model_path", self.model_path, "must be a model directory holding config.json")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TrainerConfig:
        """Builds the config from plain dicts (parsed YAML/JSON); unknown keys are errors."""
        known = {"model_path", "engine", "algorithm"}
        _refuse_unknown("", data, known)
        return cls(
            model_path=data.get("model_path", ""),
            engine=_section(EngineConfig, "engine", data.get("engine", {})),
            algorithm=_section(AlgorithmConfig, "algorithm", data.get("algorithm", {})),
        )


def _refuse_unknown(prefix: str, data: Mapping[str, Any], known: set[str]) -> None:
    if not isinstance(data, Mapping):
        raise _fail(prefix.rstrip(".") or "config", data, "must be a mapping")
    unknown = sorted(set(data) - known)
    if unknown:
        raise _fail(f"{prefix}{unknown[0]}", data[unknown[0]], f"unknown field (known: {', '.join(sorted(known))})")


def _section(cls: type[C], name: str, data: Mapping[str, Any]) -> C:
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    _refuse_unknown(f"{name}.", data, fields)
    values = dict(data)
    if isinstance(values.get("skip_statuses"), list):
        values["skip_statuses"] = tuple(values["skip_statuses"])
    return cls(**values)


# --- the service shell -------------------------------------------------------------------------

ServiceMode = Literal["scheduled", "standalone"]
_RUN_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
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
    resource_ids: tuple[str, ...] = ("trainer-0",)
    """Resources this trainer runs on; a train `Assignment` naming any of them is this trainer's."""
    model_name: str = ""
    """`model` of the WeightsPublished events (the key of `weights`); '' = the base model directory's name."""
    mode: ServiceMode = "scheduled"
    """scheduled: train when the scheduler assigns a step (Assignment + TrainData); standalone: train
    whenever `groups_per_step` complete groups (BatchReady) are buffered, no scheduler needed."""
    groups_per_step: int = 1
    """standalone mode: complete groups per train step."""
    max_staleness: int | None = None
    """Staleness bound in policy versions; None = `algorithm.max_staleness`. Overrides that field (tokens
    older than the bound are masked in the loss) and drops buffered groups whose newest token is older."""
    group_wait_s: float = 60.0
    """scheduled mode: how long a step waits for assigned groups that have not arrived before it trains on
    what is there (the missing ones are logged)."""
    poll_timeout_s: float = 0.5
    """Longest wait for new events in one poll (bounds how late a timeout or a stop request is seen)."""
    dedupe_steps: int = 64
    """Trained trajectory and group ids of this many recent steps stay in the checkpoint, besides those a
    restart will re-read, so a late duplicate (an at-least-once re-publish) is still recognised."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of the process."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """DeepSpeed, precision, batching, optimizer."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Loss and advantage estimator."""
    bus: BusConfig = field(default_factory=lambda: BusConfig.from_env(client_id="trainer"))
    """Kafka settings (SFLOW_BOOTSTRAP, SFLOW_TOPIC_PREFIX, SFLOW_REPLICATION by default)."""

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not _RUN_ID.match(self.run_id):
            raise _fail("run_id", self.run_id, "must be 1-64 of [A-Za-z0-9._:-]")
        if not isinstance(self.base_model_dir, str) or not (Path(self.base_model_dir) / "config.json").is_file():
            raise _fail("base_model_dir", self.base_model_dir, "must be a model directory holding config.json")
        if not isinstance(self.weights_root, str) or not self.weights_root:
            raise _fail("weights_root", self.weights_root, "must be a non-empty path string")
        if (not isinstance(self.resource_ids, tuple) or not self.resource_ids
                or not all(isinstance(r, str) and r for r in self.resource_ids)):
            raise _fail("resource_ids", self.resource_ids, "must be a non-empty tuple of non-empty strings")
        if not isinstance(self.model_name, str):
            raise _fail("model_name", self.model_name, "must be a string")
        _check_choice("mode", self.mode, get_args(ServiceMode))
        _check_number("groups_per_step", self.groups_per_step, low=1, integer=True)
        if self.max_staleness is not None:
            _check_number("max_staleness", self.max_staleness, low=0, integer=True)
        _check_number("group_wait_s", self.group_wait_s, low=0)
        _check_number("poll_timeout_s", self.poll_timeout_s, low=0, low_open=True)
        _check_number("dedupe_steps", self.dedupe_steps, low=0, integer=True)
        _check_choice("log_level", self.log_level, ("debug", "info", "warning", "error"))
        if not isinstance(self.engine, EngineConfig):
            raise _fail("engine", self.engine, "must be an EngineConfig")
        if not isinstance(self.algorithm, AlgorithmConfig):
            raise _fail("algorithm", self.algorithm, "must be an AlgorithmConfig")
        if not isinstance(self.bus, BusConfig):
            raise _fail("bus", self.bus, "must be a bus.config.BusConfig")

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
        algorithm = dataclasses.replace(self.algorithm, max_staleness=self.staleness_bound)
        return TrainerConfig(model_path=self.base_model_dir, engine=self.engine, algorithm=algorithm)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, bus: BusConfig | None = None) -> ServiceConfig:
        """Builds the config from plain dicts (parsed YAML/JSON); unknown keys are errors."""
        known = {f.name for f in dataclasses.fields(cls)} - {"bus"}
        _refuse_unknown("", data, known)
        values: dict[str, Any] = {k: v for k, v in data.items() if k not in ("engine", "algorithm")}
        if isinstance(values.get("resource_ids"), list | str):
            ids = values["resource_ids"]
            values["resource_ids"] = tuple(ids.split(",")) if isinstance(ids, str) else tuple(ids)
        for name in ("run_id", "base_model_dir", "weights_root"):
            values.setdefault(name, "")
        values["engine"] = _section(EngineConfig, "engine", data.get("engine", {}))
        values["algorithm"] = _section(AlgorithmConfig, "algorithm", data.get("algorithm", {}))
        if bus is not None:
            values["bus"] = bus
        return cls(**values)
