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
import threading
import time
from collections import Counter
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


class HostCpu:
    """Samples the machine's CPU counters (/proc/stat) while the runs go on. On this machine the engines, the
    trainer, the broker and the host services share two cores, so the share of the CPU a run left idle is what
    any policy could still turn into work: it bounds how far one pipeline can get ahead of another."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.samples: list[tuple[int, int, int]] = []  # (ms, busy jiffies, all jiffies)
        self.by_program: list[tuple[int, Counter[str]]] = []  # (ms, CPU jiffies so far of each program)
        self._last: dict[int, tuple[str, int]] = {}  # pid -> (program, its CPU jiffies when last seen)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(every_s,), daemon=True)

    def __enter__(self) -> HostCpu:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self, every_s: float) -> None:
        while True:
            fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
            idle = fields[3] + fields[4] + fields[7]  # idle, iowait, steal (taken by the host's other guests)
            ms = int(time.time() * 1000)
            self.samples.append((ms, sum(fields) - idle, sum(fields)))
            self.by_program.append((ms, self._programs()))
            if self._stop.wait(every_s):
                return

    def _programs(self) -> Counter[str]:
        """CPU jiffies of every process seen so far, by program (a process that exited keeps its last count)."""
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                stat = (proc / "stat").read_text()
                jiffies = sum(int(f) for f in stat.rsplit(")", 1)[1].split()[11:13])  # utime, stime
                name = program((proc / "cmdline").read_bytes().split(b"\0"))  # read again: a fork execs later
            except (OSError, ValueError, IndexError):  # exited between the listing and the read
                continue
            self._last[int(proc.name)] = (name, jiffies)
        totals: Counter[str] = Counter()
        for name, jiffies in self._last.values():
            totals[name] += jiffies
        return totals

    def program_shares(self, start_ms: int, end_ms: int) -> dict[str, float]:
        """Each program's share of the machine's CPU time between the two instants."""
        inside = [s for s in self.by_program if start_ms <= s[0] <= end_ms]
        machine = [s for s in self.samples if start_ms <= s[0] <= end_ms]
        if len(inside) < 2 or len(machine) < 2:
            return {}
        spent = inside[-1][1] - inside[0][1]
        return {name: n / max(1, machine[-1][2] - machine[0][2]) for name, n in spent.items()}

    def busy_share(self, start_ms: int, end_ms: int) -> float:
        """Share of the CPU time between the two instants that was busy (0 when too short to sample)."""
        inside = [s for s in self.samples if start_ms <= s[0] <= end_ms]
        if len(inside) < 2:
            return 0.0
        (_, busy0, all0), (_, busy1, all1) = inside[0], inside[-1]
        return (busy1 - busy0) / max(1, all1 - all0)


PROGRAMS = {"inference_svc": "engines", "trainer_svc": "trainer", "agents_adapter.proxy": "proxy",
            "agents_adapter.processor": "processor", "scheduler_svc": "scheduler", "infra.analytics": "analytics",
            "infra.rollout_workers": "agents"}


def program(argv: list[bytes]) -> str:
    """Which part of the job a command line is: a service module's name, the broker, or this bench."""
    args = [a.decode(errors="replace") for a in argv if a]
    if "-m" in args[:-1]:
        module = args[args.index("-m") + 1]
        return PROGRAMS.get(module, module)
    if any(a.endswith("kafka.Kafka") for a in args):
        return "broker"
    if any(a.endswith("pipeline_e2e.py") for a in args):
        return "bench (run monitor)"
    return "other"


def measures(result: RunResult, cpu: HostCpu) -> dict[str, float]:
    s = result.state
    span_s = max(1e-3, (s.end_ms - (s.output_tokens[0][0] if s.output_tokens else s.end_ms)) / 1000)
    util = s.utilisation()
    busy = sum(b for b, _ in util.values()) / max(1, len(util))
    idle = sum(i for _, i in util.values()) / max(1, len(util))
    work = s.work_share()
    return {"tokens/s": s.mean_tokens_per_s, "samples/s": s.trajectories / span_s, "utilisation": busy,
            "work": sum(work.values()) / max(1, len(work)), "bubble": idle, "steps": float(s.steps),
            "spanning": float(s.calls_spanning_update), "calls": float(s.calls),
            "cpu": cpu.busy_share(s.output_tokens[0][0], s.output_tokens[-1][0]) if s.output_tokens else 0.0}


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
            with HostCpu() as cpu:
                for _ in range(args.pairs):
                    runs.append({p: run(config, runs_root=Path(tmp), cluster=cluster) for p, config in jobs.items()})
        finally:
            cluster.stop()
    results = [{p: measures(r, cpu) for p, r in pair.items()} for pair in runs]
    rollout = [{p: r.state.rollout_work_share() for p, r in pair.items()} for pair in runs]
    rids = sorted({rid for pair in rollout for shares in pair.values() for rid in shares})
    table = Table(title=f"same job, {args.steps} train steps, 2 resources on 2 cores")
    for col in ("pipeline", "tokens/s", "samples/s", "host CPU busy", "tagged busy", "measured work", "bubble", "steps",
                "calls spanning an update", *(f"rollout work {rid}" for rid in rids)):
        table.add_column(col, justify="right")
    for i, (pair, shares) in enumerate(zip(results, rollout, strict=True)):
        for name, m in pair.items():
            table.add_row(name if args.pairs == 1 else f"{name} #{i + 1}", f"{m['tokens/s']:.1f}",
                          f"{m['samples/s']:.2f}", f"{m['cpu']:.0%}", f"{m['utilisation']:.0%}", f"{m['work']:.0%}",
                          f"{m['bubble']:.0%}",
                          f"{m['steps']:.0f}", f"{m['spanning']:.0f} / {m['calls']:.0f}",
                          *(f"{shares[name].get(rid, 0.0):.0%}" for rid in rids))
    console.print(table)
    console.print(cpu_table(runs, cpu))
    capable = [r.id for r in jobs["spatiotemporal"].inference.resources if "train" in r.capabilities]
    print(f"rollout work: share of a resource's time its engine ran requests; train-capable in the spatiotemporal "
          f"run: {', '.join(capable)} (its rollout work there is what it did while lent between steps)")
    print("host CPU busy: share of the machine's two cores busy (any process) between the run's first and last "
          "output token; what a run leaves idle bounds what any policy can add on this machine")
    print("\n".join(ratio_lines([m["spatiotemporal"]["tokens/s"] / max(1e-9, m["colocated"]["tokens/s"])
                                 for m in results])))


def cpu_table(runs: list[dict[str, RunResult]], cpu: HostCpu) -> Table:
    """Where each run's CPU went, as shares of the machine between its first and last output token."""
    shares = {(name, i): cpu.program_shares(r.state.output_tokens[0][0], r.state.output_tokens[-1][0])
              for i, pair in enumerate(runs) for name, r in pair.items() if r.state.output_tokens}
    programs = sorted({p for s in shares.values() for p, v in s.items() if v >= 0.005},
                      key=lambda p: -sum(s.get(p, 0.0) for s in shares.values()))
    table = Table(title="machine CPU by program (share of 2 cores)")
    for col in ("pipeline", *programs):
        table.add_column(col, justify="right")
    for (name, i), s in shares.items():
        table.add_row(name if len(runs) == 1 else f"{name} #{i + 1}", *(f"{s.get(p, 0.0):.0%}" for p in programs))
    return table


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
