"""Learning benchmark: the demo job over several seeds, one warm-up, one broker.

A demo that learns on one seed proves little: this runs the demo config (or `--config FILE`) once per seed,
varying `seed` (the engines' sampling seeds and so every rollout) while the warm-up stays the base config's
(`model.warmup_seed`), so it is trained once and then read from the cache. One Kafka broker serves every
run (each run has its own topic prefix). Per seed it prints, from the run's own `summary.json` (the one
accounting of a run: `infra.summary.run_figures`), the held-out accuracy at the first and the last
evaluation, the mean reward of the training sessions of the first and the last policy versions (every
session, also those dynamic sampling filtered from the trained batches; aborted ones, cut off by the run's
stop, left out), whether the collapse guard fired, and the wall time; a seed *improved* when its end
accuracy is at least `--min-gain` above its start, its last versions' reward is above its first versions'
and the guard never fired. Final line: `seeds improved: K/N`.

    .venv/bin/python bench/demo_seeds.py [--seeds 5] [--config infra/configs/demo.yaml] [--min-gain 0.15]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra import stack
from infra.demo import run
from infra.launcher import stop_on_sigterm
from infra.run_config import RunConfig

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "infra" / "configs" / "demo.yaml"


@dataclass(frozen=True)
class SeedResult:
    seed: int
    run: str
    steps: int
    accuracy_start: float
    accuracy_end: float
    window: int  # policy versions at each end whose sessions' rewards are compared
    reward_first: float
    reward_last: float
    aborted: int
    collapsed: bool
    wall_s: float

    def improved(self, min_gain: float) -> bool:
        return (self.accuracy_end - self.accuracy_start >= min_gain - 1e-9 and self.reward_last > self.reward_first
                and not self.collapsed)


def seed_config(base: RunConfig, seed: int) -> RunConfig:
    """The base config with another sampling seed and the base's warm-up (one cache entry for all seeds)."""
    data = base.model_dump(mode="json")
    data["name"] = f"{base.name}-seed{seed}"
    data["seed"] = seed
    data["model"]["warmup_seed"] = base.warmup_seed
    return RunConfig.model_validate(data)


def seed_result(seed: int, root: Path, wall_s: float) -> SeedResult:
    """The seed's figures as its run's `summary.json` holds them (not derived again here: two accountings
    of one run disagreed, issue 38)."""
    summary = json.loads((root / "summary.json").read_text())
    evals = summary["eval"]
    return SeedResult(
        seed=seed, run=root.name, steps=summary["steps"],
        accuracy_start=evals[0]["accuracy"] if evals else float("nan"),
        accuracy_end=evals[-1]["accuracy"] if evals else float("nan"),
        window=summary["window"], reward_first=summary["rollout_reward_first"],
        reward_last=summary["rollout_reward_last"], aborted=summary["aborted_sessions"],
        collapsed=bool(summary["collapse"]), wall_s=wall_s)


def print_table(results: list[SeedResult], min_gain: float) -> None:
    print(f"\n{'seed':>4}  {'steps':>5}  {'eval acc start -> end':>22}  {'session reward first -> last':>29}  "
          f"{'aborted':>7}  {'collapsed':>9}  {'wall s':>6}  improved  run")
    for r in results:
        print(f"{r.seed:>4}  {r.steps:>5}  {r.accuracy_start:>10.3f} -> {r.accuracy_end:<8.3f}  "
              f"{r.reward_first:>10.3f} -> {r.reward_last:<6.3f} ({r.window} v)  {r.aborted:>7}  "
              f"{'yes' if r.collapsed else 'no':>9}  {r.wall_s:>6.0f}  {'yes' if r.improved(min_gain) else 'no':>8}  "
              f"{r.run}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="runs, with seeds first-seed .. first-seed+N-1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=DEMO_CONFIG)
    parser.add_argument("--min-gain", type=float, default=0.15, help="held-out accuracy gain that counts")
    args = parser.parse_args(argv)
    logging.basicConfig(level="WARNING")
    stop_on_sigterm()
    base = RunConfig.load(args.config)
    if not base.eval.enabled:
        parser.error(f"{args.config}: eval.enabled is false; the benchmark measures held-out accuracy")
    cluster = stack.cluster(base.kafka.nodes)
    started = not cluster.running()
    if started:
        cluster.start()
    results = []
    try:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            t0 = time.monotonic()
            result = run(seed_config(base, seed), cluster=cluster)
            results.append(seed_result(seed, result.root, time.monotonic() - t0))
            print_table(results, args.min_gain)
    finally:
        if started:
            cluster.stop()
    improved = sum(r.improved(args.min_gain) for r in results)
    print(f"seeds improved: {improved}/{len(results)}")


if __name__ == "__main__":
    main()
