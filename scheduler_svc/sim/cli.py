"""`sflow sim`: run one or more pipelines of the cluster simulator and print their numbers."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from scheduler_svc.errors import SchedulerError
from scheduler_svc.sim.cluster import run_simulation
from scheduler_svc.sim.compare import FAIRNESS, advantage, best_runs, random_comparison
from scheduler_svc.sim.config import STEADY_STEPS, STEADY_WARMUP_STEPS, SimConfig
from scheduler_svc.sim.pipelines import PIPELINES
from scheduler_svc.sim.results import SimResult, draw_gantt, format_table
from scheduler_svc.sim.workload import length_distribution


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sflow sim", description=__doc__)
    p.add_argument("--pipeline", action="append", choices=PIPELINES, help="repeatable; default: all five")
    p.add_argument("--workload", choices=("math", "agentic"), default="math")
    p.add_argument("--devices", type=int, default=32)
    p.add_argument("--device-kind", default="H800", help="H800, H20, A100 or H200")
    p.add_argument("--model", default="qwen3-8b", help="qwen3-8b or qwen3-32b")
    p.add_argument("--engine-tp", type=int, default=1, help="devices per rollout engine")
    p.add_argument("--batch", type=int, default=None, help="prompts (GRPO groups) per train step")
    p.add_argument("--samples", type=int, default=None, help="samples per prompt")
    p.add_argument("--max-generation", type=int, default=None, help="max response (math) or context (agentic)")
    p.add_argument("--train-resources", type=int, default=None, help="engines carrying the train tag")
    p.add_argument("--steps", type=int, default=STEADY_STEPS, help="train steps per run, warm-up included")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=STEADY_WARMUP_STEPS,
        help="first steps left out of the measured window (the pipeline's start-up)",
    )
    p.add_argument(
        "--straggler",
        choices=("wait", "abort"),
        default="wait",
        help="strict staleness bound: wait for stragglers, or abort (discard, re-generate) them",
    )
    p.add_argument("--max-staleness", type=int, default=None, help="bound of the async pipelines (default 1)")
    p.add_argument(
        "--head-only", action="store_true", help="AReaL's head-only bound: stragglers may train with older tokens"
    )
    p.add_argument("--device-mix", default=None, help="heterogeneous pool, e.g. H800:16,H20:32 (replaces --devices)")
    p.add_argument(
        "--lengths",
        default=None,
        help="response lengths: preset (math, agentic), lognormal:MU,SIGMA, or a file of lengths, one per line",
    )
    p.add_argument("--compare", action="store_true", help="every pipeline at its best k of the grid")
    p.add_argument("--random", type=int, default=0, metavar="M", help="randomized comparison, M draws")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gantt", default=None, help="write a Gantt chart PNG of device activity here")
    return p


def parse_mix(text: str) -> tuple[tuple[str, int], ...]:
    try:
        return tuple((kind, int(n)) for kind, n in (part.split(":") for part in text.split(",")))
    except ValueError:
        raise SchedulerError(f"--device-mix {text!r}: expected KIND:COUNT[,KIND:COUNT...]") from None


def _random_mode(args: argparse.Namespace) -> int:
    print(FAIRNESS)
    print(f"each run: {args.steps} train steps, measured after the first {args.warmup_steps} (the start-up)")
    try:
        lines, _ = random_comparison(args.random, args.seed, args.steps, args.warmup_steps)
    except SchedulerError as e:
        print(f"sflow sim: {e}")
        return 2
    print("\n".join(lines))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.random:
        return _random_mode(args)
    results: list[SimResult] = []
    try:
        mix = parse_mix(args.device_mix) if args.device_mix else ()
        workload = None if args.lengths is None else length_distribution(args.lengths, seed=args.seed)
        for pipeline in () if args.compare else args.pipeline or PIPELINES:
            config = SimConfig(
                pipeline=pipeline,
                workload=args.workload,
                devices=args.devices,
                device_mix=mix,
                device_kind=args.device_kind,
                model=args.model,
                engine_tp=args.engine_tp,
                train_batch_groups=args.batch,
                samples_per_task=args.samples,
                max_generation=args.max_generation,
                train_resources=args.train_resources,
                steps=args.steps,
                warmup_steps=args.warmup_steps,
                seed=args.seed,
                straggler=args.straggler,
                max_staleness=args.max_staleness,
                strict_staleness=not args.head_only,
                keep_segments=args.gantt is not None,
            )
            results.append(run_simulation(config, workload=workload))
        if args.compare:
            base = SimConfig(
                workload=args.workload, devices=args.devices, device_mix=mix, device_kind=args.device_kind,
                model=args.model, train_batch_groups=args.batch, samples_per_task=args.samples, steps=args.steps,
                warmup_steps=args.warmup_steps, seed=args.seed, keep_segments=False,
            )  # fmt: skip
            best = best_runs(base, workload)
            results = list(best.values())
            print(FAIRNESS)
    except SchedulerError as e:
        print(f"sflow sim: {e}")
        return 2
    first = results[0].settings
    print(
        f"workload={args.lengths or args.workload} devices={args.device_mix or args.devices} model={args.model} "
        f"batch={first['batch']}x{first['n']} "
        f"steps={args.steps} (measured after {args.warmup_steps})"
    )
    print(format_table(results))
    by_name = {r.pipeline: r for r in results}
    if "spatiotemporal" in by_name and "colocated_sync" in by_name:
        ratio = by_name["spatiotemporal"].tokens_per_s / by_name["colocated_sync"].tokens_per_s
        print(f"ratio tokens/s spatiotemporal vs colocated_sync: {ratio:.2f}x")
    if args.compare:
        print(f"ratio tokens/s spatiotemporal vs best other pipeline: {advantage(by_name):.2f}x")
    if args.gantt:
        print(f"gantt: {draw_gantt(results, args.gantt)}")
    return 0
