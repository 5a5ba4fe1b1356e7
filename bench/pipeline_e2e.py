"""Real pipeline comparison on this machine: the same short job twice in one run, colocated synchronous
vs spatiotemporal, through every service and the real broker (infra.demo.run).

Both runs get the same model (the cached warm-up), tasks, train batch, samples per task, engines and
number of train steps; only the scheduler's policy differs. Printed: rollout tokens/s, samples/s,
mean tagged utilisation, measured work (engine runs + train steps) and bubble of the resources, and the
ratio spatiotemporal / colocated.

Run: .venv/bin/python bench/pipeline_e2e.py [--steps 16] [--pairs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.demo import RunResult, run
from infra.kafka.cluster import KafkaCluster, free_base_port
from infra.run_config import RunConfig

BASE = Path(__file__).resolve().parents[1] / "infra" / "configs" / "demo.yaml"


def job(policy: str, steps: int) -> RunConfig:
    base = RunConfig.load(BASE).model_dump()
    base["name"] = f"bench-{policy}"
    base["scheduler"]["policy"] = policy
    base["run"] = {"max_steps": steps, "max_minutes": 15}
    base["eval"] = {**base["eval"], "enabled": False}  # throughput of the policies, not held-out accuracy
    if policy == "colocated":  # verl-style: every resource takes every tag (the trainer spans both), on-policy
        for r in base["inference"]["resources"]:
            r["capabilities"] = ["rollout", "train"]
        base["scheduler"]["max_staleness"] = 0
    return RunConfig.model_validate(base)


def measures(result: RunResult) -> dict[str, float]:
    s = result.state
    span_s = max(1e-3, (s.end_ms - (s.output_tokens[0][0] if s.output_tokens else s.end_ms)) / 1000)
    util = s.utilisation()
    busy = sum(b for b, _ in util.values()) / max(1, len(util))
    idle = sum(i for _, i in util.values()) / max(1, len(util))
    work = s.work_share()
    return {"tokens/s": s.mean_tokens_per_s, "samples/s": s.trajectories / span_s, "utilisation": busy,
            "work": sum(work.values()) / max(1, len(work)), "bubble": idle, "steps": float(s.steps),
            "spanning": float(s.calls_spanning_update), "calls": float(s.calls)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16,
                        help="train steps per run (the first few overlap the services' start-up)")
    parser.add_argument("--pairs", type=int, default=1,
                        help="colocated + spatiotemporal pairs, run alternately on one broker; the final ratio is "
                             "their median (single runs vary by a third on a shared machine)")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs must be >= 1, got {args.pairs}")
    console = Console(width=150)
    jobs = {p: job(p, args.steps) for p in ("colocated", "spatiotemporal")}
    runs: list[dict[str, RunResult]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cluster = KafkaCluster(Path(tmp) / "kafka", nodes=1, base_port=free_base_port())
        cluster.start()
        try:
            for _ in range(args.pairs):
                runs.append({p: run(config, runs_root=Path(tmp), cluster=cluster) for p, config in jobs.items()})
        finally:
            cluster.stop()
    results = [{p: measures(r) for p, r in pair.items()} for pair in runs]
    rollout = [{p: r.state.rollout_work_share() for p, r in pair.items()} for pair in runs]
    rids = sorted({rid for pair in rollout for shares in pair.values() for rid in shares})
    table = Table(title=f"same job, {args.steps} train steps, 2 resources on 2 cores")
    for col in ("pipeline", "tokens/s", "samples/s", "tagged busy", "measured work", "bubble", "steps",
                "calls spanning an update", *(f"rollout work {rid}" for rid in rids)):
        table.add_column(col, justify="right")
    for i, (pair, shares) in enumerate(zip(results, rollout, strict=True)):
        for name, m in pair.items():
            table.add_row(name if args.pairs == 1 else f"{name} #{i + 1}", f"{m['tokens/s']:.1f}",
                          f"{m['samples/s']:.2f}", f"{m['utilisation']:.0%}", f"{m['work']:.0%}", f"{m['bubble']:.0%}",
                          f"{m['steps']:.0f}", f"{m['spanning']:.0f} / {m['calls']:.0f}",
                          *(f"{shares[name].get(rid, 0.0):.0%}" for rid in rids))
    console.print(table)
    capable = [r.id for r in jobs["spatiotemporal"].inference.resources if "train" in r.capabilities]
    print(f"rollout work: share of a resource's time its engine ran requests; train-capable in the spatiotemporal "
          f"run: {', '.join(capable)} (its rollout work there is what it did while lent between steps)")
    print("\n".join(ratio_lines([m["spatiotemporal"]["tokens/s"] / max(1e-9, m["colocated"]["tokens/s"])
                                 for m in results])))


def ratio_lines(ratios: list[float]) -> list[str]:
    """The closing lines: each pair's ratio where there are several, then the median (the bench's result)."""
    if len(ratios) == 1:
        return [f"ratio rollout tokens/s spatiotemporal vs colocated_sync: {ratios[0]:.2f}x"]
    return [f"ratio of each pair: {', '.join(f'{r:.2f}x' for r in ratios)} (min {min(ratios):.2f}x, "
            f"max {max(ratios):.2f}x)",
            f"ratio rollout tokens/s spatiotemporal vs colocated_sync (median of {len(ratios)} pairs): "
            f"{statistics.median(ratios):.2f}x"]


if __name__ == "__main__":
    main()
