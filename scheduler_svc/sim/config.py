"""One simulated run's settings, validated at construction; sizes left unset derive from the device count."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from scheduler_svc.errors import ConfigError
from scheduler_svc.policies import StragglerRule
from scheduler_svc.roofline import DeviceSpec, device_preset
from scheduler_svc.sim.model import Efficiency
from scheduler_svc.sim.pipelines import Pipeline
from scheduler_svc.sim.workload import WorkloadKind

_E = TypeVar("_E", bound=StrEnum)

#: The measured horizon of every simulated run unless told otherwise (`sflow sim`, its randomized mode,
#: `bench/pipeline_sim.py`): the steady state, not the start-up. Pipelines with a staleness bound settle
#: into a two-step cycle (the burst of groups a step's end dispatches is trained two steps later, so on
#: math 32 the step periods alternate ~80 s / ~300 s), and the first steps start on a full pipeline (2B
#: groups dispatched at t=0). One warm-up step and five measured periods measured that start and the
#: cycle's phase (three short periods of five): math 32's spatiotemporal read 34,304 tokens/s over
#: steps 1-5, against 30,761 over twenty periods after two warm-up steps. Two warm-up steps skip the
#: start; an even number of measured periods (here 20) holds whole cycles.
STEADY_WARMUP_STEPS = 2
STEADY_STEPS = 22


def _member(kind: type[_E], name: str, value: str) -> _E:
    """Parse a mode given as its string (as configs and the CLI spell it) into its enum member."""
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"SimConfig.{name} must be one of {[m.value for m in kind]}, got {value!r}") from None


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. Unset sizes are derived from `devices` (see `resolved`)."""

    pipeline: Pipeline = Pipeline.SPATIOTEMPORAL
    workload: WorkloadKind = WorkloadKind.MATH
    devices: int = 32
    device_kind: str = "H800"
    #: heterogeneous pool: ((kind, count), ...) replaces devices/device_kind
    device_mix: tuple[tuple[str, int], ...] = ()
    model: str = "qwen3-8b"
    engine_tp: int = 1  # devices per rollout engine (one resource = one engine)
    max_generation: int | None = None  # math: max response tokens; agentic: max context
    train_batch_groups: int | None = None  # B prompts per step; default 2/engine (math), 1/engine (agentic)
    samples_per_task: int | None = None  # n; default 16 (math), 8 (agentic)
    max_running_seqs: int = 64
    inflight_per_resource: int | None = None  # loader capacity; default max_running_seqs (x2 agentic)
    train_fraction: float = 0.25  # share of engines carrying the train tag (disaggregated, spatiotemporal)
    train_resources: int | None = None  # overrides train_fraction
    microbatches: int = 4
    steps: int = STEADY_STEPS  # train steps simulated; the first `warmup_steps` are not measured
    warmup_steps: int = STEADY_WARMUP_STEPS
    weight_sync_s: float = 3.0
    switch_s: float = 4.0
    optimizer_s: float = 2.0
    reprefill_on_weight_sync: bool = True
    #: the staleness bound of the asynchronous pipelines (offpolicy_fill, spatiotemporal); None: 1
    max_staleness: int | None = None
    #: False: AReaL's head-only bound (dispatch budget only; stragglers may train with older tokens)
    strict_staleness: bool = True
    #: what a strict bound does with a group that would get too old: wait for it, or abort it
    straggler: StragglerRule = StragglerRule.WAIT
    max_regenerations: int = 1
    efficiency: Efficiency = field(default_factory=Efficiency)
    memory_fraction: float = 0.9
    activation_reserve_gb: float = 4.0
    failures: tuple[tuple[float, int], ...] = ()  # (time, engine index)
    joins: tuple[tuple[float, str], ...] = ()  # (time, device kind)
    failure_detect_s: float = 10.0
    seed: int = 0
    keep_segments: bool = True
    max_sim_time_s: float = 1e7

    def __post_init__(self) -> None:
        # frozen: the modes are normalised once, from the strings configs and the CLI give
        object.__setattr__(self, "pipeline", _member(Pipeline, "pipeline", self.pipeline))
        object.__setattr__(self, "workload", _member(WorkloadKind, "workload", self.workload))
        object.__setattr__(self, "straggler", _member(StragglerRule, "straggler", self.straggler))
        self._check_sizes()
        if self.straggler == StragglerRule.ABORT and not self.strict_staleness:
            raise ConfigError("SimConfig.straggler='abort' needs strict_staleness=True")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError(f"SimConfig.max_staleness must be >= 0 or None, got {self.max_staleness!r}")
        for name in ("weight_sync_s", "switch_s", "optimizer_s", "failure_detect_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"SimConfig.{name} must be >= 0, got {getattr(self, name)!r}")

    def _check_sizes(self) -> None:
        if self.devices < 2 and not self.device_mix:
            raise ConfigError(f"SimConfig.devices must be >= 2, got {self.devices!r}")
        if self.engine_tp < 1:
            raise ConfigError(f"SimConfig.engine_tp must be >= 1, got {self.engine_tp!r}")
        if self.steps <= self.warmup_steps or self.warmup_steps < 0:
            raise ConfigError(f"SimConfig.steps ({self.steps!r}) must exceed warmup_steps ({self.warmup_steps!r}) >= 0")
        if not 0 < self.train_fraction < 1:
            raise ConfigError(f"SimConfig.train_fraction must be in (0, 1), got {self.train_fraction!r}")
        if self.max_running_seqs < 1 or self.microbatches < 1:
            raise ConfigError(
                f"SimConfig.max_running_seqs and microbatches must be >= 1, got "
                f"{self.max_running_seqs!r}, {self.microbatches!r}"
            )

    def engine_specs(self) -> list[DeviceSpec]:
        kinds: list[str] = []
        if self.device_mix:
            for kind, count in self.device_mix:
                kinds.extend([kind] * count)
        else:
            kinds = [self.device_kind] * self.devices
        if len(kinds) % self.engine_tp:
            raise ConfigError(f"{len(kinds)} devices do not split into engines of engine_tp={self.engine_tp}")
        return [device_preset(kinds[i]).scaled(self.engine_tp) for i in range(0, len(kinds), self.engine_tp)]

    def resolved(self) -> dict[str, int]:
        engines = len(self.engine_specs())
        agentic = self.workload == WorkloadKind.AGENTIC
        batch = self.train_batch_groups or (engines if agentic else 2 * engines)
        n = self.samples_per_task or (8 if agentic else 16)
        inflight = self.inflight_per_resource or (self.max_running_seqs * (2 if agentic else 1))
        k = self.train_resources or max(1, round(self.train_fraction * engines))
        if k >= engines:
            raise ConfigError(f"train_resources ({k}) must be smaller than the engine count ({engines})")
        return {"engines": engines, "batch": batch, "n": n, "inflight": inflight, "train_resources": k}
