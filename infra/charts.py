"""PNG charts of a run: reward per train step, activity Gantt per resource, rollout throughput."""

from __future__ import annotations

from pathlib import Path

from infra.monitor import RunState

COLOURS = {"rollout": "#4c72b0", "train": "#dd8452", "weight_sync": "#c44e52", "idle": "#dddddd",
           "offline": "#222222", "reference": "#55a868", "critic": "#8172b3"}


def draw_charts(run_dir: Path, state: RunState) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[Path] = []
    if state.rewards:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([s for s, _ in state.rewards], [r for _, r in state.rewards], marker="o", label="trained batch")
        rollout = state.rollout_rewards()
        ax.plot([v for v, _ in rollout], [r for _, r in rollout], marker=".", label="every session (by version)")
        ax.legend(fontsize=7)
        ax.set_xlabel("train step / policy version")
        ax.set_ylabel("mean reward")
        ax.set_title("reward")
        ax.grid(alpha=0.3)
        out.append(_save(fig, run_dir / "reward.png"))
    if state.activity:
        t0 = min(spans[0][0] for spans in state.activity.values())
        fig, ax = plt.subplots(figsize=(9, 1.6 + 0.5 * len(state.activity)))
        for row, (_rid, spans) in enumerate(sorted(state.activity.items())):
            for (a, act), (b, _) in zip(spans, [*spans[1:], (state.end_ms, "")], strict=True):
                ax.barh(row, (b - a) / 1000, left=(a - t0) / 1000, color=COLOURS.get(act, "#999999"), height=0.6)
        ax.set_yticks(range(len(state.activity)), sorted(state.activity))
        ax.set_xlabel("seconds")
        ax.set_title("activity tags per resource")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
        ax.legend(handles, list(COLOURS), fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        out.append(_save(fig, run_dir / "gantt.png"))
    if state.output_tokens:
        t0 = state.output_tokens[0][0]
        buckets: dict[int, int] = {}
        for t, n in state.output_tokens:
            buckets[(t - t0) // 10_000] = buckets.get((t - t0) // 10_000, 0) + n
        xs = sorted(buckets)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar([x * 10 for x in xs], [buckets[x] / 10 for x in xs], width=9)
        ax.set_xlabel("seconds")
        ax.set_ylabel("generated tokens/s")
        ax.set_title("rollout throughput (10 s buckets)")
        out.append(_save(fig, run_dir / "throughput.png"))
    return out


def _save(fig: object, path: Path) -> Path:
    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    import matplotlib.pyplot as plt

    plt.close(fig)  # type: ignore[arg-type]
    return path
