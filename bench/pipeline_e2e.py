"""Real pipeline comparison on this machine: the same short job twice in one run, colocated synchronous
vs spatiotemporal, through every service and the real broker (infra.demo.run).

Both runs get the same model (the cached warm-up), tasks, train batch, samples per task, engines and
number of train steps; only the scheduler's policy differs. Printed: rollout tokens/s, samples/s,
the machine's busy CPU, mean tagged utilisation, measured work (engine runs + train steps) and bubble of the
resources, a table of the machine's CPU by program, and the ratio spatiotemporal / colocated.

Run: .venv/bin/python bench/pipeline_e2e.py [--steps 16] [--pairs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.demo import RunResult, run
from infra.kafka.cluster import KafkaCluster, free_base_port
from infra.launcher import stop_on_sigterm
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


@dataclass(frozen=True)
class CpuSample:
    """The machine's CPU seconds so far (busy, all) and each program's, at one instant."""

    ms: int
    busy_s: float
    all_s: float
    programs: Mapping[str, float]


class HostCpu:
    """Samples the machine's CPU counters while the runs go on. On this machine the engines, the trainer, the
    broker and the host services share two cores, so the share of the CPU a run left idle is what any policy
    could still turn into work: it bounds how far one pipeline can get ahead of another."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.samples: list[CpuSample] = []
        self._last: dict[int, tuple[str, float]] = {}  # pid -> (program, its CPU seconds when last seen)
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
            times = psutil.cpu_times()
            counted = sum(times[:8])  # user .. steal, as /proc/stat's first line (guest is inside user)
            idle = times.idle + times.iowait + times.steal  # steal: taken by the host's other guests
            self.samples.append(CpuSample(int(time.time() * 1000), counted - idle, counted, self._programs()))
            if self._stop.wait(every_s):
                return

    def _programs(self) -> dict[str, float]:
        """CPU seconds of every process seen so far, by program (a process that exited keeps its last count)."""
        for proc in psutil.process_iter(["cmdline", "cpu_times"]):
            cmdline, spent = proc.info["cmdline"], proc.info["cpu_times"]
            if cmdline is not None and spent is not None:  # None: it exited or is not ours to read
                self._last[proc.pid] = (program(cmdline), spent.user + spent.system)
        totals: defaultdict[str, float] = defaultdict(float)
        for name, seconds in self._last.values():
            totals[name] += seconds
        return totals

    def _window(self, start_ms: int, end_ms: int) -> tuple[CpuSample, CpuSample] | None:
        """The first and last sample between the two instants (None: fewer than two)."""
        inside = [s for s in self.samples if start_ms <= s.ms <= end_ms]
        return (inside[0], inside[-1]) if len(inside) >= 2 else None

    def busy_share(self, start_ms: int, end_ms: int) -> float:
        """Share of the CPU time between the two instants that was busy (0 when too short to sample)."""
        window = self._window(start_ms, end_ms)
        if window is None:
            return 0.0
        first, last = window
        return (last.busy_s - first.busy_s) / max(1e-9, last.all_s - first.all_s)

    def program_shares(self, start_ms: int, end_ms: int) -> dict[str, float]:
        """Each program's share of the machine's CPU time between the two instants."""
        window = self._window(start_ms, end_ms)
        if window is None:
            return {}
        first, last = window
        machine = max(1e-9, last.all_s - first.all_s)
        spent = {name: s - first.programs.get(name, 0.0) for name, s in last.programs.items()}
        return {name: s / machine for name, s in spent.items() if s > 0}


PROGRAMS = {"inference_svc": "engines", "trainer_svc": "trainer", "agents_adapter.proxy": "proxy",
            "agents_adapter.processor": "processor", "scheduler_svc": "scheduler", "infra.analytics": "analytics",
            "infra.rollout_workers": "agents"}


def program(args: list[str]) -> str:
    """Which part of the job a command line is: a service module's name, the broker, or this bench."""
    if "-m" in args[:-1]:
        module = args[args.index("-m") + 1]
        return PROGRAMS.get(module, module)
    if any(a.endswith("kafka.Kafka") for a in args):
        return "broker"
    if any(a.endswith("pipeline_e2e.py") for a in args):
        return "bench (run monitor)"
    return "other"


def token_window(result: RunResult) -> tuple[int, int] | None:
    """The run's first and last output token (ms): the span its tokens/s and its CPU shares are measured on."""
    tokens = result.state.output_tokens
    return (tokens[0][0], tokens[-1][0]) if tokens else None


def row_label(name: str, pair: int, pairs: int) -> str:
    return name if pairs == 1 else f"{name} #{pair + 1}"


def measures(result: RunResult, cpu: HostCpu) -> dict[str, float]:
    s = result.state
    window = token_window(result)
    span_s = max(1e-3, (s.end_ms - (s.output_tokens[0][0] if s.output_tokens else s.end_ms)) / 1000)
    util = s.utilisation()
    busy = sum(b for b, _ in util.values()) / max(1, len(util))
    idle = sum(i for _, i in util.values()) / max(1, len(util))
    work = s.work_share()
    return {"tokens/s": s.mean_tokens_per_s, "samples/s": s.trajectories / span_s, "utilisation": busy,
            "work": sum(work.values()) / max(1, len(work)), "bubble": idle, "steps": float(s.steps),
            "spanning": float(s.calls_spanning_update), "calls": float(s.calls),
            "cpu": cpu.busy_share(*window) if window else 0.0}


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
    stop_on_sigterm()  # `timeout`/`kill` stop the broker and the processes it started too
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
            table.add_row(row_label(name, i, args.pairs), f"{m['tokens/s']:.1f}",
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
    ratios = [m["spatiotemporal"]["tokens/s"] / max(1e-9, m["colocated"]["tokens/s"]) for m in results]
    print(ceiling_line(ratios, [m["spatiotemporal"]["cpu"] for m in results]))
    print("\n".join(ratio_lines(ratios)))


def cpu_table(runs: list[dict[str, RunResult]], cpu: HostCpu) -> Table:
    """Where each run's CPU went, as shares of the machine between its first and last output token."""
    shares = {row_label(name, i, len(runs)): cpu.program_shares(*window)
              for i, pair in enumerate(runs) for name, r in pair.items() if (window := token_window(r))}
    programs = sorted({p for s in shares.values() for p, v in s.items() if v >= 0.005},
                      key=lambda p: -sum(s.get(p, 0.0) for s in shares.values()))
    table = Table(title="machine CPU by program (share of 2 cores)")
    for col in ("pipeline", *programs):
        table.add_column(col, justify="right")
    for label, s in shares.items():
        table.add_row(label, *(f"{s.get(p, 0.0):.0%}" for p in programs))
    return table


def ceiling_line(ratios: list[float], spatiotemporal_busy: list[float]) -> str:
    """What each pair's spatiotemporal run would make with the whole machine busy at its measured CPU per
    token: on two cores shared by the devices and the services, no policy gets beyond it (lending turns
    idle device time into work; when the machine's CPU is what is idle, only CPU left idle can be turned)."""
    ceilings = [r / b for r, b in zip(ratios, spatiotemporal_busy, strict=True) if b > 0]
    if not ceilings:
        return "ceiling on this machine: not measured (no CPU samples in a spatiotemporal run's window)"
    return (f"ceiling on this machine (spatiotemporal at 100 % host CPU busy, its CPU per token as measured): "
            f"{', '.join(f'{c:.2f}x' for c in ceilings)}")


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
