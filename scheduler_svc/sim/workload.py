"""Synthetic RL workloads with long-tailed lengths, drawn per (task, sample) so every pipeline sees
exactly the same samples.

Single-turn math: one prompt, one reasoning response, log-normal length capped at the max
generation length (8K-20K in the paper). Agentic (SWE-agent-like): a long prompt, then turns of
generation, a tool call with a latency, and an observation appended to the context, until the agent
stops or the context reaches 64K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from scheduler_svc.errors import ConfigError


class WorkloadKind(StrEnum):
    MATH = "math"
    AGENTIC = "agentic"


@dataclass(frozen=True, slots=True)
class Turn:
    gen_tokens: int
    obs_tokens: int = 0  # tool output appended after this turn (0 on the last turn)
    tool_s: float = 0.0  # tool latency after this turn


@dataclass(frozen=True, slots=True)
class SampleSpec:
    prompt_tokens: int
    turns: tuple[Turn, ...]

    @property
    def generated_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns)

    @property
    def total_tokens(self) -> int:
        """Length of the final trajectory (prompt, generations and observations): what the trainer sees."""
        return self.prompt_tokens + sum(t.gen_tokens + t.obs_tokens for t in self.turns)


class Workload(Protocol):
    @property
    def name(self) -> str: ...

    def sample(self, position: int, sample_index: int) -> SampleSpec: ...


_MASK = (1 << 64) - 1


class _Stream:
    """Counter-based random stream (splitmix64): cheap to create per sample, same numbers on every
    platform and Python version, so a task draws identical lengths in every pipeline."""

    __slots__ = ("_state",)

    def __init__(self, seed: int, position: int, sample_index: int) -> None:
        self._state = (
            seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + sample_index * 0x94D049BB133111EB
        ) & _MASK

    def uniform(self) -> float:
        self._state = (self._state + 0x9E3779B97F4A7C15) & _MASK
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        z ^= z >> 31
        return ((z >> 11) + 0.5) / float(1 << 53)

    def gauss(self) -> float:
        """Standard normal (Box-Muller)."""
        return math.sqrt(-2.0 * math.log(self.uniform())) * math.cos(2.0 * math.pi * self.uniform())


def _lognormal(rng: _Stream, median: float, sigma: float, low: float, high: float) -> float:
    return min(high, max(low, median * math.exp(sigma * rng.gauss())))


@dataclass(frozen=True, slots=True)
class SingleTurnMath:
    name: str = "math"
    prompt_median: float = 300.0
    prompt_sigma: float = 0.4
    response_median: float = 4000.0
    response_sigma: float = 0.9
    max_response: int = 20_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_response < 1 or self.response_median <= 0:
            raise ConfigError(
                f"SingleTurnMath needs max_response >= 1 and response_median > 0, got "
                f"{self.max_response!r}, {self.response_median!r}"
            )

    def sample(self, position: int, sample_index: int) -> SampleSpec:
        rng = _Stream(self.seed, position, sample_index)
        prompt = int(_lognormal(rng, self.prompt_median, self.prompt_sigma, 32, 4096))
        response = int(_lognormal(rng, self.response_median, self.response_sigma, 16, self.max_response))
        return SampleSpec(prompt, (Turn(response),))


@dataclass(frozen=True, slots=True)
class AgenticCoding:
    name: str = "agentic"
    prompt_median: float = 2500.0
    prompt_sigma: float = 0.3
    turns_median: float = 12.0
    turns_sigma: float = 0.6
    max_turns: int = 60
    gen_median: float = 350.0
    gen_sigma: float = 0.9
    max_gen_per_turn: int = 8192
    obs_median: float = 600.0
    obs_sigma: float = 1.0
    max_obs_per_turn: int = 8192
    tool_median_s: float = 3.0
    tool_sigma: float = 0.9
    max_tool_s: float = 120.0
    max_context: int = 65_536
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_context <= self.prompt_median or self.max_turns < 1:
            raise ConfigError(
                f"AgenticCoding needs max_context > prompt_median and max_turns >= 1, got "
                f"{self.max_context!r}, {self.max_turns!r}"
            )

    def sample(self, position: int, sample_index: int) -> SampleSpec:
        rng = _Stream(self.seed, position, sample_index)
        prompt = int(_lognormal(rng, self.prompt_median, self.prompt_sigma, 256, self.max_context // 4))
        n_turns = round(_lognormal(rng, self.turns_median, self.turns_sigma, 1, self.max_turns))
        context = prompt
        turns: list[Turn] = []
        for i in range(n_turns):
            gen = int(_lognormal(rng, self.gen_median, self.gen_sigma, 8, self.max_gen_per_turn))
            gen = min(gen, self.max_context - context)
            context += gen
            last = i == n_turns - 1 or context >= self.max_context
            if last or gen <= 0:
                turns.append(Turn(max(gen, 1)))
                break
            obs = int(_lognormal(rng, self.obs_median, self.obs_sigma, 16, self.max_obs_per_turn))
            obs = min(obs, self.max_context - context - 1)
            tool = _lognormal(rng, self.tool_median_s, self.tool_sigma, 0.05, self.max_tool_s)
            if obs <= 0:
                turns.append(Turn(gen))
                break
            context += obs
            turns.append(Turn(gen, obs, tool))
        return SampleSpec(prompt, tuple(turns))


def workload_preset(name: str, *, seed: int = 0, max_response: int | None = None) -> Workload:
    if name == WorkloadKind.MATH:
        return SingleTurnMath(seed=seed, max_response=max_response or 20_000)
    if name == WorkloadKind.AGENTIC:
        return AgenticCoding(seed=seed, max_context=max_response or 65_536)
    raise ConfigError(f"unknown workload {name!r}; use 'math' or 'agentic'")


@dataclass(frozen=True, slots=True)
class ObservedLengths:
    """Single-turn responses drawn from observed lengths (e.g. exported from a real run's analytics
    store), so the simulator replays a cluster's own long tail instead of a parametric guess."""

    lengths: tuple[int, ...]
    name: str = "observed"
    prompt_tokens: int = 300
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 1:
            raise ConfigError(f"ObservedLengths.lengths must be non-empty positive integers, got {self.lengths[:5]!r}")

    def sample(self, position: int, sample_index: int) -> SampleSpec:
        rng = _Stream(self.seed, position, sample_index)
        return SampleSpec(self.prompt_tokens, (Turn(self.lengths[int(rng.uniform() * len(self.lengths))]),))


def length_distribution(spec: str, *, seed: int = 0, max_response: int | None = None) -> Workload:
    """A workload from a CLI spec: a preset name (math, agentic), ``lognormal:MU,SIGMA`` (response
    length e^(MU + SIGMA z), capped at `max_response`), or a file of observed lengths, one per line."""
    if spec in tuple(WorkloadKind):
        return workload_preset(spec, seed=seed, max_response=max_response)
    if spec.startswith("lognormal:"):
        try:
            mu, sigma = (float(x) for x in spec.removeprefix("lognormal:").split(","))
        except ValueError:
            raise ConfigError(f"lengths {spec!r}: expected lognormal:MU,SIGMA (two numbers)") from None
        if sigma < 0:
            raise ConfigError(f"lengths {spec!r}: SIGMA must be >= 0")
        return SingleTurnMath(
            name=spec,
            response_median=math.exp(mu),
            response_sigma=sigma,
            max_response=max_response or 20_000,
            seed=seed,
        )
    try:
        with open(spec, encoding="utf-8") as f:
            lengths = tuple(int(line) for line in f if line.strip())
    except (OSError, ValueError) as e:
        raise ConfigError(f"lengths {spec!r}: not a preset, lognormal:MU,SIGMA or a file of integers ({e})") from e
    return ObservedLengths(lengths, name=spec, seed=seed)
