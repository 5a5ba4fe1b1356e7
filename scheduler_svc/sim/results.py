"""What a simulation run reports, and the Gantt chart of activity per device (paper fig. 3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any


class Activity(StrEnum):
    """Device-time categories. Busy = useful compute; bubble = nothing to do; overhead = switching,
    weight loading and re-prefill after preemption or new weights."""

    ROLLOUT = "rollout"
    TRAIN = "train"
    ROLLOUT_BUBBLE = "rollout_bubble"
    TRAIN_BUBBLE = "train_bubble"
    IDLE = "idle"
    WEIGHT_SYNC = "weight_sync"
    SWITCH = "switch"
    REPREFILL = "reprefill"
    OFFLINE = "offline"


BUSY_STATES = (Activity.ROLLOUT, Activity.TRAIN)
BUBBLE_STATES = (Activity.ROLLOUT_BUBBLE, Activity.TRAIN_BUBBLE, Activity.IDLE)
OVERHEAD_STATES = (Activity.WEIGHT_SYNC, Activity.SWITCH, Activity.REPREFILL)
ALL_STATES = BUSY_STATES + BUBBLE_STATES + OVERHEAD_STATES + (Activity.OFFLINE,)

STATE_COLORS: dict[str, str] = {
    Activity.ROLLOUT: "#2e8b57",
    Activity.ROLLOUT_BUBBLE: "#cfe8d8",
    Activity.TRAIN: "#1f5fbf",
    Activity.TRAIN_BUBBLE: "#c9d7f0",
    Activity.IDLE: "#eeeeee",
    Activity.WEIGHT_SYNC: "#f0a030",
    Activity.SWITCH: "#d04040",
    Activity.REPREFILL: "#e07070",
    Activity.OFFLINE: "#222222",
}

Segment = tuple[float, float, str]


@dataclass
class SimResult:
    pipeline: str
    workload: str
    devices: int
    train_resources: int
    steps_measured: int
    window_s: float
    tokens_per_s: float
    samples_per_s: float
    utilisation: float
    bubble: float
    overhead: float
    mean_staleness: float
    max_staleness: int
    mean_step_s: float
    #: running sequences per decoding engine, time-weighted: low values are the long tail at work
    mean_decode_batch: float
    samples_per_step: float
    state_shares: dict[str, float]
    events: int
    wall_clock_s: float
    sim_time_s: float
    #: lag of the trained tokens (step - version that generated each token), token-weighted mean and max;
    #: mean/max_staleness above are per trained group, by its oldest token
    mean_token_staleness: float = 0.0
    max_token_staleness: int = 0
    #: share of the generated tokens that were discarded (groups aborted past the staleness bound)
    waste: float = 0.0
    aborted_groups: int = 0
    dropped_groups: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    segments: list[list[Segment]] = field(default_factory=list, repr=False)
    device_names: list[str] = field(default_factory=list, repr=False)

    def row(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "tokens/s": self.tokens_per_s,
            "samples/s": self.samples_per_s,
            "util": self.utilisation,
            "bubble": self.bubble,
            "overhead": self.overhead,
            "staleness": self.mean_staleness,
            "token_staleness": self.mean_token_staleness,
            "max_token_staleness": self.max_token_staleness,
            "waste": self.waste,
            "step_s": self.mean_step_s,
            "decode_batch": self.mean_decode_batch,
        }


def format_table(results: Sequence[SimResult]) -> str:
    header = (
        f"{'pipeline':<20} {'tokens/s':>10} {'samples/s':>10} {'util':>6} {'bubble':>7} "
        f"{'overhd':>7} {'waste':>6} {'tok-stale':>9} {'max':>3} {'step s':>7} {'batch':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.pipeline:<20} {r.tokens_per_s:>10.0f} {r.samples_per_s:>10.2f} {r.utilisation:>6.1%} "
            f"{r.bubble:>7.1%} {r.overhead:>7.1%} {r.waste:>6.1%} {r.mean_token_staleness:>9.2f} "
            f"{r.max_token_staleness:>3} {r.mean_step_s:>7.1f} {r.mean_decode_batch:>6.1f}"
        )
    return "\n".join(lines)


def draw_gantt(results: Sequence[SimResult], path: str | Path, *, max_devices: int = 64) -> Path:
    """One panel per pipeline, one row per device, coloured by activity (like the paper's fig. 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    panels = [r for r in results if r.segments]
    fig, axes = plt.subplots(len(panels), 1, figsize=(14, 2.2 + 1.9 * len(panels)), squeeze=False)
    for ax, result in zip(axes[:, 0], panels, strict=True):
        rows = result.segments[:max_devices]
        for row_index, segments in enumerate(rows):
            by_state: dict[str, list[tuple[float, float]]] = {}
            for t0, t1, state in segments:
                by_state.setdefault(state, []).append((t0, t1 - t0))
            for state, spans in by_state.items():
                ax.broken_barh(spans, (row_index, 0.9), facecolors=STATE_COLORS.get(state, "#999999"))
        ax.set_ylim(0, len(rows))
        ax.set_yticks([])
        ax.set_ylabel(f"{len(rows)} devices")
        ax.set_title(
            f"{result.pipeline}: {result.tokens_per_s:,.0f} tok/s, bubble {result.bubble:.1%}, "
            f"staleness {result.mean_staleness:.2f}",
            fontsize=9,
            loc="left",
        )
    axes[-1, 0].set_xlabel("simulated time (s)")
    handles = [Patch(color=c, label=s) for s, c in STATE_COLORS.items()]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def shares(totals: Mapping[str, float]) -> dict[str, float]:
    alive = sum(v for k, v in totals.items() if k != Activity.OFFLINE)
    if alive <= 0:
        return {k: 0.0 for k in ALL_STATES}
    return {k: totals.get(k, 0.0) / alive for k in ALL_STATES if k != Activity.OFFLINE}
