"""Roofline model of accelerators: presets, attainable FLOP/s, and the `train_priority` tag.

Training (large-token GEMMs, forward and backward) has an arithmetic intensity of hundreds of FLOP
per HBM byte, above every preset's ridge point, so it runs at peak compute. Batched decoding reads
every weight and the whole KV cache once per generated token and reaches only tens of FLOP per byte,
so it runs at `intensity x bandwidth`. A device's *comparative* advantage for training is therefore

    train_priority = attainable(train intensity) / attainable(decode intensity)

and placing the train tag on the devices with the highest ratio keeps bandwidth-rich devices (H20,
H200) on rollout and compute-rich ones (H800, A100) available for training. Ranking by this ratio,
not by peak FLOP/s alone, is what maximises the joint throughput when every device must be used
(the classic comparative-advantage argument).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduler_svc.errors import ConfigError

#: FLOP per HBM byte of a training step's GEMMs (thousands of tokens per micro-batch); above the ridge
#: point of every preset, so training is compute bound everywhere.
TRAIN_INTENSITY = 400.0
#: FLOP per HBM byte of continuous-batching decode (batch of a few dozen sequences, KV reads included).
DECODE_INTENSITY = 16.0


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One accelerator (or one engine's tensor-parallel group, with summed numbers)."""

    kind: str
    peak_tflops: float  # dense BF16 tensor-core TFLOP/s
    hbm_tb_per_s: float  # HBM bandwidth, TB/s
    memory_gb: float  # HBM capacity, GB

    def __post_init__(self) -> None:
        for name in ("peak_tflops", "hbm_tb_per_s", "memory_gb"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"DeviceSpec.{name} must be > 0, got {value!r} for kind {self.kind!r}")

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_per_s * 1e12

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte above which the device is compute bound."""
        return self.peak_flops / self.hbm_bytes_per_s

    def scaled(self, count: int) -> DeviceSpec:
        """The aggregate of `count` identical devices working as one tensor-parallel engine."""
        if count < 1:
            raise ConfigError(f"DeviceSpec.scaled count must be >= 1, got {count!r}")
        if count == 1:
            return self
        return DeviceSpec(
            f"{self.kind}x{count}", self.peak_tflops * count, self.hbm_tb_per_s * count, self.memory_gb * count
        )


#: Vendor datasheet numbers (SXM parts, dense BF16 without sparsity).
DEVICE_PRESETS: dict[str, DeviceSpec] = {
    "H800": DeviceSpec("H800", peak_tflops=989.0, hbm_tb_per_s=3.35, memory_gb=80.0),
    "H20": DeviceSpec("H20", peak_tflops=148.0, hbm_tb_per_s=4.0, memory_gb=96.0),
    "A100": DeviceSpec("A100", peak_tflops=312.0, hbm_tb_per_s=2.039, memory_gb=80.0),
    "H200": DeviceSpec("H200", peak_tflops=989.0, hbm_tb_per_s=4.8, memory_gb=141.0),
}


def device_preset(kind: str) -> DeviceSpec:
    try:
        return DEVICE_PRESETS[kind]
    except KeyError:
        raise ConfigError(f"unknown device kind {kind!r}; presets: {sorted(DEVICE_PRESETS)}") from None


def attainable_flops(spec: DeviceSpec, intensity: float) -> float:
    """Roofline: min(peak compute, intensity x memory bandwidth)."""
    if not intensity > 0:
        raise ConfigError(f"arithmetic intensity must be > 0, got {intensity!r}")
    return min(spec.peak_flops, intensity * spec.hbm_bytes_per_s)


def train_priority(
    spec: DeviceSpec, *, train_intensity: float = TRAIN_INTENSITY, decode_intensity: float = DECODE_INTENSITY
) -> float:
    """Comparative advantage of `spec` for training over decoding (dimensionless, higher = train first)."""
    return attainable_flops(spec, train_intensity) / attainable_flops(spec, decode_intensity)


def rank_for_training(specs: Iterable[tuple[str, DeviceSpec]]) -> list[str]:
    """Resource ids best suited to training first; ties keep the given order."""
    indexed = list(specs)
    order = sorted(range(len(indexed)), key=lambda i: (-train_priority(indexed[i][1]), i))
    return [indexed[i][0] for i in order]
