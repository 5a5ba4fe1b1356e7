"""The end of a run: the summary table, `summary.json` and the charts, from what the run monitor saw.

The trained batch's reward is not the policy's reward once dynamic sampling filters groups (a step
trains on the groups its samples disagree on), so the summary also shows the reward of every training
session by the policy version it started under (`RunState.rollout_rewards`).
"""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from typing import Any

from rich.console import Console
from rich.table import Table

from infra.monitor import RunMonitor, RunState
from infra.phases import PhaseClock
from infra.run_config import RunConfig
from infra.run_inputs import RunPaths

log = logging.getLogger("sflow.demo")
console = Console()


class StopReason(StrEnum):
    """Why a run ended (`summary.json`'s `ended_by`)."""

    MAX_STEPS = "max_steps"  # it trained `run.max_steps` steps: the normal end
    MAX_MINUTES = "max_minutes"  # its wall-time budget `run.max_minutes` ran out first
    STALLED = "stalled"  # nothing completed for `run.stall_minutes` (the task stream ran out, or a fault)


ENDED_BY = {StopReason.MAX_STEPS: "run.max_steps reached", StopReason.MAX_MINUTES: "run.max_minutes reached",
            StopReason.STALLED: "stall: nothing completed for run.stall_minutes (task stream exhausted?)"}


def run_figures(s: RunState) -> dict[str, Any]:
    """The run's figures as `summary.json` holds them: the one accounting of a run, which its table prints
    and every reader of its results (bench/demo_seeds.py) reads, rather than deriving its own."""
    k = max(1, min(3, s.steps // 2))
    first, last = ends([r for _, r in s.rewards], k)
    rollout_first, rollout_last = ends([r for _, r in s.rollout_rewards()], k)
    return {"window": k, "reward_first": first, "reward_last": last, "rollout_reward_first": rollout_first,
            "rollout_reward_last": rollout_last, "aborted_sessions": len(s.aborted_sessions), "steps": s.steps,
            "calls": s.calls, "sessions": s.trajectories, "tokens_per_s": s.mean_tokens_per_s,
            "mean_staleness": s.mean_staleness, "mean_pause_ms": s.mean_pause_ms,
            "calls_spanning_update": s.calls_spanning_update,
            "health_first_last": {m: list(v) for m, v in s.health_first_last(k).items()},
            "filtered_groups": len(s.filtered_groups),
            "collapse": [{"step": step, "signals": list(sig)} for step, sig in s.collapse],
            "eval": s.eval_summary()}


def summarise(config: RunConfig, paths: RunPaths, monitor: RunMonitor, ended_by: StopReason,
              clock: PhaseClock | None = None) -> None:
    from infra.charts import draw_charts

    s = monitor.snapshot()
    figures = run_figures(s)
    k = figures["window"]
    util = s.utilisation()
    work = s.work_share()
    table = Table(title=f"run {paths.root.name}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row(f"reward of the trained batch, first / last {k} steps",
                  f"{figures['reward_first']:.3f} / {figures['reward_last']:.3f}")
    table.add_row(f"reward of every session, first / last {k} versions",
                  f"{figures['rollout_reward_first']:.3f} / {figures['rollout_reward_last']:.3f}")
    table.add_row("sessions aborted (cut off: not in the rewards)", str(figures["aborted_sessions"]))
    table.add_row("train steps / policy version", f"{s.steps} / v{s.version}")
    table.add_row("ended by", ENDED_BY[ended_by])
    table.add_row("LLM calls / sessions", f"{s.calls} / {s.trajectories}")
    table.add_row("rollout tokens/s (mean)", f"{s.mean_tokens_per_s:,.1f}")
    for rid, (busy, idle) in sorted(util.items()):
        table.add_row(f"{rid}: tagged busy / measured work / idle",
                      f"{busy:.0%} / {work.get(rid, 0.0):.0%} / {idle:.0%}")
    table.add_row("staleness of trained tokens (mean)", f"{s.mean_staleness:.2f}")
    table.add_row("weight-sync pause ms (mean / max)", f"{s.mean_pause_ms:.0f} / {s.max_pause_ms:.0f}")
    table.add_row("calls spanning a weight update", f"{s.calls_spanning_update} / {s.calls}")
    for metric, (at_start, at_end) in s.health_first_last(k).items():
        table.add_row(f"{metric.replace('_', ' ')}, first / last {k} steps", f"{at_start:.3f} / {at_end:.3f}")
    table.add_row("groups filtered (dynamic sampling)", str(len(s.filtered_groups)))
    table.add_row("collapse guard", s.collapse_verdict())
    table.add_row("eval accuracy, start -> end", s.eval_start_end())
    stored = _analytics_counts(paths)
    table.add_row("analytics rows: llm_calls / trajectories",
                  f"{stored.get('llm_calls', 0)} / {stored.get('trajectories', 0)}")
    console.print(table)
    charts = draw_charts(paths.root, s)
    summary = {**figures, "ended_by": ended_by,
               "utilisation": {r: {"busy": b, "work": work.get(r, 0.0), "idle": i} for r, (b, i) in util.items()},
               "analytics_rows": stored, "charts": [str(c) for c in charts],
               "phases_s": {name: round(seconds, 1) for name, seconds in (clock.seconds if clock else {}).items()}}
    (paths.root / "summary.json").write_text(json.dumps(summary, indent=2))
    if clock is not None:
        console.print(_phase_table(clock))
    console.print(_next_steps(paths))


def _phase_table(clock: PhaseClock) -> Table:
    table = Table(title="where the time went")
    table.add_column("phase")
    table.add_column("wall s", justify="right")
    for name, seconds in clock.seconds.items():
        table.add_row(name, f"{seconds:.0f}")
    table.add_row("total (Kafka's stop not included)", f"{clock.total:.0f}")
    return table


def _next_steps(paths: RunPaths) -> str:
    """The newcomer's next clicks: the run's files, its dashboard, the docs."""
    run = paths.root
    return "\n".join([
        f"[bold]next[/]: the run's files are under {run}/",
        "  summary.json, reward.png (reward per train step), gantt.png (each resource's tags over time:"
        " lending), throughput.png, logs/",
        f"  sflow dashboard --run {run.name}   then open http://127.0.0.1:8765/",
        f"  sflow analytics eval --run {run.name}   held-out results;  sflow replay --help   the event log",
        "  train your own agent: examples/calculator/README.md;  every option: docs/training.md",
    ])


def ends(values: list[float], k: int) -> tuple[float, float]:
    """Means of the first and the last `k` values (nan when there are none)."""
    if not values:
        return float("nan"), float("nan")
    return sum(values[:k]) / len(values[:k]), sum(values[-k:]) / len(values[-k:])


def _analytics_counts(paths: RunPaths) -> dict[str, int]:
    """Rows in the run's analytics store (after the sink stopped): they should match the event counts."""
    from infra.analytics.config import AnalyticsConfig, open_store
    from infra.analytics.errors import AnalyticsError

    try:
        with open_store(AnalyticsConfig(data_dir=paths.analytics), read_only=True) as store:
            return store.counts()
    except AnalyticsError as e:
        log.warning("analytics store unreadable", extra={"error": str(e)})
        return {}
