"""Fair comparison of every pipeline on one cluster and workload, and randomized comparisons.

Fairness as in `bench/pipeline_sim.py`: every pipeline gets the same batch, the same per-device
concurrency, the same costs and the same samples (the workload draws per task and sample index); the
split pipelines (and spatiotemporal's train-capable pool) each get their best `k` from the grid
N/8, N/4, 3N/8, N/2, the asynchronous ones also the better straggler rule (wait, abort).

Randomized mode: each draw picks a workload and a pool from the ranges below (heterogeneous pools
included) and runs every pipeline on it with the same samples.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Iterator

from scheduler_svc.policies import StragglerRule
from scheduler_svc.sim.cluster import run_simulation
from scheduler_svc.sim.config import SimConfig
from scheduler_svc.sim.pipelines import PIPELINES, Pipeline
from scheduler_svc.sim.results import SimResult
from scheduler_svc.sim.workload import SingleTurnMath, Workload

ASYNC = (Pipeline.OFFPOLICY_FILL, Pipeline.SPATIOTEMPORAL)
#: ranges of the randomized mode: pool sizes, device kinds, log-normal response medians and sigmas
RANDOM_DEVICES = (8, 12, 16, 24, 32)
RANDOM_KINDS = ("H800", "H20", "A100", "H200")
RANDOM_MEDIAN = (1000.0, 8000.0)
RANDOM_SIGMA = (0.3, 1.2)
FAIRNESS = (
    "fairness: same batch, same per-device concurrency, same costs and samples for every pipeline; "
    "split pipelines get their best k of the grid N/8..N/2 (async ones also the better straggler rule)"
)


def k_grid(engines: int) -> list[int]:
    return sorted({max(1, engines * f // 8) for f in (1, 2, 3, 4)})


def best_runs(base: SimConfig, workload: Workload | None = None) -> dict[str, SimResult]:
    """Each pipeline's best run over the grid (colocated_sync has no split)."""
    engines = base.resolved()["engines"]
    out: dict[str, SimResult] = {}
    for pipeline in PIPELINES:
        splits: list[int | None] = [None] if pipeline == Pipeline.COLOCATED_SYNC else list(k_grid(engines))
        rules = tuple(StragglerRule) if pipeline in ASYNC else (StragglerRule.WAIT,)
        for k in splits:
            for rule in rules:
                cfg = dataclasses.replace(base, pipeline=pipeline, train_resources=k, straggler=rule)
                r = run_simulation(cfg, workload=workload)
                if pipeline not in out or r.tokens_per_s > out[pipeline].tokens_per_s:
                    out[pipeline] = r
    return out


def advantage(results: dict[str, SimResult]) -> float:
    """spatiotemporal / best other pipeline, tokens per second."""
    best = max(r.tokens_per_s for p, r in results.items() if p != Pipeline.SPATIOTEMPORAL)
    return results[Pipeline.SPATIOTEMPORAL].tokens_per_s / best


def random_draws(count: int, seed: int, steps: int, warmup_steps: int) -> Iterator[tuple[str, SimConfig, Workload]]:
    """`count` workloads and pools drawn from the documented ranges (half the pools mix two kinds)."""
    rng = random.Random(seed)
    for i in range(count):
        devices = rng.choice(RANDOM_DEVICES)
        kinds = rng.sample(RANDOM_KINDS, 2)
        mix = ((kinds[0], devices // 2), (kinds[1], devices - devices // 2)) if i % 2 else ((kinds[0], devices),)
        median = rng.uniform(*RANDOM_MEDIAN)
        sigma = rng.uniform(*RANDOM_SIGMA)
        workload = SingleTurnMath(name="lognormal", response_median=median, response_sigma=sigma, seed=seed + i)
        groups = 2 * devices
        cfg = SimConfig(
            device_mix=mix, train_batch_groups=groups, samples_per_task=8, steps=steps, warmup_steps=warmup_steps,
            keep_segments=False,
        )  # fmt: skip
        label = "+".join(f"{k}:{n}" for k, n in mix) + f" median {median:.0f} sigma {sigma:.2f}"
        yield label, cfg, workload


def random_comparison(count: int, seed: int, steps: int, warmup_steps: int) -> tuple[list[str], list[float]]:
    lines, ratios = [], []
    for i, (label, cfg, workload) in enumerate(random_draws(count, seed, steps, warmup_steps)):
        results = best_runs(cfg, workload)
        ratio = advantage(results)
        ratios.append(ratio)
        best = max((r for p, r in results.items() if p != Pipeline.SPATIOTEMPORAL), key=lambda r: r.tokens_per_s)
        lines.append(f"draw {i:>3} {label:<44} spatiotemporal / best other ({best.pipeline}): {ratio:.3f}x")
    lines.append(f"worst advantage: {min(ratios):.3f}x  median advantage: {statistics.median(ratios):.3f}x")
    return lines, ratios
