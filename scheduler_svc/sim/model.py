"""Analytic cost model of an LLM on one accelerator: decode, prefill and training times.

Decode is integrated analytically over many iterations (request granularity, not per token): with
b running sequences holding C context tokens in total, one continuous-batching iteration takes

    a(b) + beta * C,   a(b) = overhead + max(weights / BW, b * 2P / FLOPs),   beta = kv_bytes / BW

(dense layers follow the roofline: bandwidth bound until the batch is large enough to be compute
bound; attention is bound by reading the KV cache). Every iteration adds b tokens to C, so k
iterations take k (a + beta C) + beta b k^2 / 2 -- closed form in both directions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler_svc.errors import ConfigError
from scheduler_svc.roofline import DeviceSpec


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params_b: float  # parameters, billions
    layers: int
    hidden: int  # attention width (heads x head_dim)
    kv_heads: int
    head_dim: int
    bytes_per_param: float = 2.0  # bf16 weights
    kv_bytes_per_value: float = 2.0  # bf16 KV cache

    @property
    def params(self) -> float:
        return self.params_b * 1e9

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_value


MODEL_PRESETS: dict[str, ModelSpec] = {
    "qwen3-8b": ModelSpec("qwen3-8b", params_b=8.2, layers=36, hidden=4096, kv_heads=8, head_dim=128),
    "qwen3-32b": ModelSpec("qwen3-32b", params_b=32.8, layers=64, hidden=8192, kv_heads=8, head_dim=128),
}


def model_preset(name: str) -> ModelSpec:
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; presets: {sorted(MODEL_PRESETS)}") from None


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achieved fractions of the roofline (typical for SGLang/vLLM decode and FSDP/Megatron training)."""

    decode_bandwidth: float = 0.8
    decode_compute: float = 0.6
    prefill_mfu: float = 0.6
    train_mfu: float = 0.4
    iteration_overhead_s: float = 0.003  # scheduler + kernel launches per decode iteration

    def __post_init__(self) -> None:
        for name in ("decode_bandwidth", "decode_compute", "prefill_mfu", "train_mfu"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"Efficiency.{name} must be in (0, 1], got {value!r}")
        if self.iteration_overhead_s < 0:
            raise ConfigError(f"Efficiency.iteration_overhead_s must be >= 0, got {self.iteration_overhead_s!r}")


class DevicePerf:
    """Times of one engine (a device or a tensor-parallel group) running one model."""

    def __init__(self, model: ModelSpec, device: DeviceSpec, eff: Efficiency) -> None:
        bandwidth = device.hbm_bytes_per_s * eff.decode_bandwidth
        self.model = model
        self.device = device
        self.eff = eff
        self.weights_s = model.weight_bytes / bandwidth
        self.flops_s_per_seq = 2 * model.params / (device.peak_flops * eff.decode_compute)
        self.beta = model.kv_bytes_per_token / bandwidth
        self.overhead_s = eff.iteration_overhead_s
        self._prefill_rate = device.peak_flops * eff.prefill_mfu

    def iteration_base(self, batch: int) -> float:
        return self.overhead_s + max(self.weights_s, batch * self.flops_s_per_seq)

    def time_for_steps(self, steps: float, batch: int, context: float) -> float:
        """Seconds for `steps` decode iterations of `batch` sequences holding `context` tokens."""
        a = self.iteration_base(batch) + self.beta * context
        return steps * a + self.beta * batch * steps * steps / 2

    def steps_in(self, seconds: float, batch: int, context: float) -> float:
        """Decode iterations completed in `seconds` (inverse of time_for_steps)."""
        if seconds <= 0:
            return 0.0
        a = self.iteration_base(batch) + self.beta * context
        q = self.beta * batch
        # stable root of q/2 k^2 + a k - s = 0
        return 2 * seconds / (a + math.sqrt(a * a + 2 * q * seconds))

    def prefill_time(self, new_tokens: float, prefix_tokens: float) -> float:
        if new_tokens <= 0:
            return 0.0
        m = self.model
        flops = 2 * m.params * new_tokens + 4 * m.layers * m.hidden * new_tokens * (prefix_tokens + new_tokens / 2)
        return flops / self._prefill_rate


def train_flops(model: ModelSpec, sequence_lengths: Iterable[int]) -> float:
    """Actor forward + backward (6P per token) and reference forward (2P), with causal attention."""
    dense = 0.0
    attention = 0.0
    for length in sequence_lengths:
        dense += length
        attention += float(length) * length
    return 8 * model.params * dense + 8 * model.layers * model.hidden * attention


def train_time(
    model: ModelSpec, devices: Iterable[DeviceSpec], eff: Efficiency, sequence_lengths: Iterable[int]
) -> float:
    """SPMD step on `devices`: data parallel, so the slowest device sets the pace."""
    specs = list(devices)
    if not specs:
        raise ConfigError("train_time needs at least one device")
    slowest = min(s.peak_flops for s in specs)
    return train_flops(model, sequence_lengths) / (len(specs) * slowest * eff.train_mfu)
