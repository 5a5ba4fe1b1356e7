"""Native engine benchmark on the default model (CPU): not a test, numbers measured in one run.

1. Decode throughput: the native engine vs transformers `model.generate` (same model, same sampling:
   temperature 1, no top-k/top-p, a fixed number of new tokens) at batch sizes 1 / 16 / 64.
2. Continuous batching vs static batches under Poisson arrivals (same engine, only the admission
   policy differs: static waits for the whole batch to finish before the next one starts, and returns
   results at the batch's end, as `generate` does). Throughput and p50 / p99 latency.
3. The pause -> swap -> resume stall of a weight update driven through the controller while 16
   requests are decoding, and the re-prefill that follows.

Run: `.venv/bin/python bench/engine_bench.py` (a few minutes on 2 cores). Last line:
`ratio native vs hf generate @bs16: X.XXx`.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from inference_svc.controller import InferenceController
from inference_svc.default_model import create_default_model, write_perturbed_checkpoint
from inference_svc.engine import NativeEngine
from schemas.inference.types import GenerationResult, SamplingOptions


@dataclass
class Args:
    new_tokens: int
    prompt_len: int
    batch_sizes: list[int]
    repeats: int
    poisson_requests: int
    load: float
    serving_rounds: int
    threads: int


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--batch-sizes", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per point (the median is shown)")
    parser.add_argument("--poisson-requests", type=int, default=120)
    parser.add_argument("--load", type=float, default=0.6, help="arrival rate as a fraction of bs16 capacity")
    parser.add_argument("--serving-rounds", type=int, default=2, help="alternating continuous/static runs")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch threads for both sides (default 1: the ops of a 0.8M model are too small to split, and "
        "on a shared 2-core machine a second thread mostly waits)",
    )
    ns = parser.parse_args()
    return Args(
        ns.new_tokens, ns.prompt_len, [int(b) for b in ns.batch_sizes.split(",")], ns.repeats,
        ns.poisson_requests, ns.load, ns.serving_rounds, ns.threads,
    )


@dataclass(frozen=True)
class Timing:
    wall_s: float  # median wall-clock seconds of a run
    cpu_s: float  # median CPU seconds the process spent (robust when other jobs share the cores)


def interleaved_median_times(runs: list[Callable[[], object]], repeats: int) -> list[Timing]:
    for run in runs:
        run()  # warm-up
    walls: list[list[float]] = [[] for _ in runs]
    cpus: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, wall, cpu in zip(runs, walls, cpus, strict=True):
            started, cpu_started = time.perf_counter(), time.process_time()
            run()
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - cpu_started)
    return [Timing(statistics.median(w), statistics.median(c)) for w, c in zip(walls, cpus, strict=True)]


@dataclass(frozen=True)
class Throughput:
    hf_tps: float
    native_tps: float
    hf_cpu_tps: float  # tokens per CPU-second
    native_cpu_tps: float


def bench_throughput(args: Args, hf: torch.nn.Module, engine: NativeEngine, pad_id: int) -> dict[int, Throughput]:
    """Median tokens/s of each side; the two sides alternate run by run so load changes hit both."""
    rng = torch.Generator().manual_seed(0)
    results: dict[int, Throughput] = {}
    n = args.new_tokens
    for bs in args.batch_sizes:
        prompts = torch.randint(0, 256, (bs, args.prompt_len), generator=rng)

        def run_hf(prompts: torch.Tensor = prompts, bs: int = bs) -> None:
            with torch.inference_mode():
                out = hf.generate(  # type: ignore[operator]
                    prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0, top_k=0,
                    top_p=1.0, max_new_tokens=n, min_new_tokens=n, pad_token_id=pad_id,
                )
            assert out.shape == (bs, args.prompt_len + n)

        def run_native(prompts: torch.Tensor = prompts) -> None:
            futures = [
                engine.submit(p, SamplingOptions(max_new_tokens=n, ignore_eos=True, seed=i))
                for i, p in enumerate(prompts.tolist())
            ]
            assert all(len(f.result().output_ids) == n for f in futures)

        hf_t, native_t = interleaved_median_times([run_hf, run_native], args.repeats)
        tokens = bs * n
        results[bs] = Throughput(
            tokens / hf_t.wall_s, tokens / native_t.wall_s, tokens / hf_t.cpu_s, tokens / native_t.cpu_s
        )
        print(f"  bs={bs:>3}: hf generate {tokens / hf_t.wall_s:9.0f} tok/s   native {tokens / native_t.wall_s:9.0f} "
              f"tok/s", flush=True)
    return results


@dataclass
class Workload:
    arrivals: list[float]  # seconds after start
    prompts: list[list[int]]
    budgets: list[int]


def poisson_workload(n: int, rate: float, prompt_len: int, seed: int = 1) -> Workload:
    rng = random.Random(seed)
    t, arrivals = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    prompts = [[rng.randrange(256) for _ in range(prompt_len)] for _ in range(n)]
    budgets = [rng.randint(16, 160) for _ in range(n)]
    return Workload(arrivals, prompts, budgets)


@dataclass
class ServingStats:
    throughput: float
    p50_ms: float
    p99_ms: float


def _stats(work: Workload, started: float, finished: list[float]) -> ServingStats:
    latencies = sorted((f - started - a) * 1000 for f, a in zip(finished, work.arrivals, strict=True))
    span = max(finished) - started
    return ServingStats(
        throughput=sum(work.budgets) / span,
        p50_ms=latencies[len(latencies) // 2],
        p99_ms=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    )


def _stamp(finished: list[float], index: int) -> Callable[[Future[GenerationResult]], None]:
    def record(_: Future[GenerationResult]) -> None:
        finished[index] = time.perf_counter()

    return record


def serve_continuous(engine: NativeEngine, work: Workload) -> ServingStats:
    finished = [0.0] * len(work.arrivals)
    futures: list[Future[GenerationResult]] = []
    started = time.perf_counter()
    for i, (arrival, prompt, budget) in enumerate(zip(work.arrivals, work.prompts, work.budgets, strict=True)):
        delay = started + arrival - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        future = engine.submit(prompt, SamplingOptions(max_new_tokens=budget, ignore_eos=True, seed=i))
        future.add_done_callback(_stamp(finished, i))
        futures.append(future)
    for future in futures:
        future.result()
    return _stats(work, started, finished)


def serve_static(engine: NativeEngine, work: Workload, max_batch: int) -> ServingStats:
    """Batch = everything that arrived while the previous batch ran; results come back at its end."""
    finished = [0.0] * len(work.arrivals)
    started = time.perf_counter()
    next_up = 0
    while next_up < len(work.arrivals):
        wait = started + work.arrivals[next_up] - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        now = time.perf_counter() - started
        batch = [i for i in range(next_up, len(work.arrivals)) if work.arrivals[i] <= now][:max_batch]
        futures = [
            engine.submit(work.prompts[i], SamplingOptions(max_new_tokens=work.budgets[i], ignore_eos=True, seed=i))
            for i in batch
        ]
        for future in futures:
            future.result()
        done = time.perf_counter()
        for i in batch:
            finished[i] = done
        next_up = batch[-1] + 1
    return _stats(work, started, finished)


def serve_alternating(engine: NativeEngine, work: Workload, rounds: int) -> tuple[ServingStats, ServingStats]:
    """Continuous and static runs alternate (C, S, C, S, ...); each metric is the median over rounds."""
    runs: dict[str, list[ServingStats]] = {"continuous": [], "static": []}
    for _ in range(rounds):
        runs["continuous"].append(serve_continuous(engine, work))
        runs["static"].append(serve_static(engine, work, max_batch=64))

    def median(stats: list[ServingStats]) -> ServingStats:
        return ServingStats(
            throughput=statistics.median(s.throughput for s in stats),
            p50_ms=statistics.median(s.p50_ms for s in stats),
            p99_ms=statistics.median(s.p99_ms for s in stats),
        )

    return median(runs["continuous"]), median(runs["static"])


def bench_swap(engine: NativeEngine, checkpoints: list[Path], rounds: int = 3) -> tuple[float, float, float]:
    """Median (pause_ms, load_ms, re-prefill ms until every request made a token under the new version)."""
    controller = InferenceController(engine, "bench", require_sha256=False)  # checkpoints made by this bench
    pauses, loads, refills = [], [], []
    for r in range(rounds):
        futures = [
            engine.submit([(7 * i + j) % 256 for j in range(32)], SamplingOptions(max_new_tokens=400, ignore_eos=True))
            for i in range(16)
        ]
        while min((len(s.output_ids) for s in engine.snapshot()), default=0) < 8:
            time.sleep(0.001)
        version = engine.weight_version + 1
        result = controller.on_load_weights(str(checkpoints[r % len(checkpoints)]), version)
        assert result.ok, result.error
        resumed = time.perf_counter()
        while not all(version in s.output_versions for s in engine.snapshot()):
            time.sleep(0.0005)
        refills.append((time.perf_counter() - resumed) * 1000)
        pauses.append(result.pause_ms)
        loads.append(result.load_ms)
        engine.abort_all()
        for f in futures:
            f.result()
    return statistics.median(pauses), statistics.median(loads), statistics.median(refills)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = create_default_model(Path(tmp) / "model")
        perturbed = write_perturbed_checkpoint(model_dir, Path(tmp) / "model-v1")
        hf = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
        pad_id = int(AutoTokenizer.from_pretrained(str(model_dir)).pad_token_id)
        n_params = sum(p.numel() for p in hf.parameters())
        print(f"default model: {n_params / 1e6:.2f}M params, torch threads={torch.get_num_threads()}, "
              f"prompt={args.prompt_len} tokens, new={args.new_tokens} tokens", flush=True)
        with NativeEngine(model_dir, max_running_requests=64, max_context=1024) as engine:
            print("decode throughput (median of runs):", flush=True)
            throughput = bench_throughput(args, hf, engine, pad_id)
            mean_budget = (16 + 160) / 2
            rate = args.load * throughput[16].native_tps / mean_budget if 16 in throughput else 50.0
            work = poisson_workload(args.poisson_requests, rate, args.prompt_len)
            print(f"serving {args.poisson_requests} Poisson arrivals at {rate:.0f} req/s "
                  f"(budgets 16..160 tokens):", flush=True)
            continuous, static = serve_alternating(engine, work, args.serving_rounds)
            pause_ms, load_ms, refill_ms = bench_swap(engine, [perturbed, model_dir])

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print()
    print(f"(wall clock; 1-min load average at the end {load:.1f} on {os.cpu_count()} cores. tok/CPU-s divides by the "
          "CPU time the process used, which other jobs on the machine do not inflate as much)")
    print(f"{'measure':<44}{'hf generate':>14}{'native':>14}{'ratio':>9}")
    for bs, t in throughput.items():
        ratio = t.native_tps / t.hf_tps
        print(f"{f'decode tok/s @ batch {bs}':<44}{t.hf_tps:>14.0f}{t.native_tps:>14.0f}{ratio:>8.2f}x")
    for bs, t in throughput.items():
        print(f"{f'decode tok/CPU-s @ batch {bs}':<44}{t.hf_cpu_tps:>14.0f}{t.native_cpu_tps:>14.0f}"
              f"{t.native_cpu_tps / t.hf_cpu_tps:>8.2f}x")
    print()
    print(f"{'Poisson serving (median of alternating runs)':<44}{'static':>14}{'continuous':>14}{'ratio':>9}")
    print(f"{'throughput tok/s':<44}{static.throughput:>14.0f}{continuous.throughput:>14.0f}"
          f"{continuous.throughput / static.throughput:>8.2f}x")
    print(f"{'p50 latency ms':<44}{static.p50_ms:>14.0f}{continuous.p50_ms:>14.0f}"
          f"{static.p50_ms / continuous.p50_ms:>8.2f}x")
    print(f"{'p99 latency ms':<44}{static.p99_ms:>14.0f}{continuous.p99_ms:>14.0f}"
          f"{static.p99_ms / continuous.p99_ms:>8.2f}x")
    print()
    print(f"weight swap with 16 running requests: pause->resume {pause_ms:.1f} ms (load {load_ms:.1f} ms), "
          f"re-prefill until all carry the new version {refill_ms:.1f} ms")
    if 16 in throughput:
        print(f"ratio native vs hf generate @bs16: {throughput[16].native_tps / throughput[16].hf_tps:.2f}x")


if __name__ == "__main__":
    main()
