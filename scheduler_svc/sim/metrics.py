"""The steady-state numbers of a finished run, measured over the steps after warm-up."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

from scheduler_svc.sim.pipelines import Pipeline
from scheduler_svc.sim.results import (
    ALL_STATES,
    BUBBLE_STATES,
    BUSY_STATES,
    OVERHEAD_STATES,
    Segment,
    SimResult,
    shares,
)
from scheduler_svc.sim.world import SimWorld


def _activity_shares(world: SimWorld, t0: float, t1: float) -> dict[str, float]:
    """Share of the device time inside the window [t0, t1] spent in each activity."""
    totals: dict[str, float] = dict.fromkeys(ALL_STATES, 0.0)
    for dev in world.devices:
        for s0, s1, state in dev.segments:
            lo, hi = max(s0, t0), min(s1, t1)
            if hi > lo:
                totals[state] = totals.get(state, 0.0) + hi - lo
    return shares(totals)


def sim_result(world: SimWorld, wall_clock_s: float) -> SimResult:
    cfg = world.config
    first = cfg.warmup_steps - 1
    t0 = world.step_end[first] if first >= 0 else 0.0
    last = cfg.steps - 1
    t1 = world.step_end[last]
    measured = [world.completed_steps[s] for s in range(cfg.warmup_steps, cfg.steps)]
    window = max(t1 - t0, 1e-9)
    tokens = sum(s.tokens for s in measured)
    samples = sum(s.samples for s in measured)
    lags = [lag for s in measured for lag in s.lags]
    token_lags: Counter[int] = Counter()
    for s in measured:
        token_lags.update(s.token_lags)
    trained_tokens = sum(token_lags.values())
    share = _activity_shares(world, t0, t1)
    segments: list[list[Segment]] = []
    if cfg.keep_segments:
        segments = [[(s[0], s[1], s[2]) for s in dev.segments] for dev in world.devices]
    colocated = cfg.pipeline == Pipeline.COLOCATED_SYNC
    return SimResult(
        pipeline=cfg.pipeline,
        workload=cfg.workload,
        devices=len(world.devices) * cfg.engine_tp,
        train_resources=len(world.devices) if colocated else world.sizes["train_resources"],
        steps_measured=len(measured),
        window_s=window,
        tokens_per_s=tokens / window,
        samples_per_s=samples / window,
        utilisation=sum(share[s] for s in BUSY_STATES),
        bubble=sum(share[s] for s in BUBBLE_STATES),
        overhead=sum(share[s] for s in OVERHEAD_STATES),
        mean_staleness=sum(lags) / len(lags) if lags else 0.0,
        max_staleness=max(lags) if lags else 0,
        mean_token_staleness=(
            sum(lag * n for lag, n in token_lags.items()) / trained_tokens if trained_tokens else 0.0
        ),
        max_token_staleness=max((lag for lag, n in token_lags.items() if n), default=0),
        waste=world.wasted_tokens / (tokens + world.wasted_tokens) if tokens + world.wasted_tokens else 0.0,
        aborted_groups=world.aborted_groups,
        dropped_groups=world.dropped_groups,
        mean_step_s=window / max(len(measured), 1),
        mean_decode_batch=world.batch_seconds / world.decode_seconds if world.decode_seconds else 0.0,
        samples_per_step=samples / max(len(measured), 1),
        state_shares=share,
        events=world.event_count,
        wall_clock_s=wall_clock_s,
        sim_time_s=world.now,
        settings={**world.sizes, **{k: v for k, v in asdict(cfg).items() if k != "efficiency"}},
        segments=segments,
        device_names=[dev.rid for dev in world.devices],
    )
