"""Capture proxy overhead: latency added to an LLM call, and 1,000 concurrent sessions held.

Starts, on 127.0.0.1 free ports: a one-broker Kafka (KRaft) unless --bootstrap is given, the native
engine (`python -m inference_svc`, default model) and the proxy (`python -m agents_adapter.proxy`), each its
own process. Then, in one run:

  1. latency, first of one session back to back (no queueing: the proxy's own cost), then of
     `--sessions` (64) concurrent multi-turn sessions, each `--turns` requests with
     max_new_tokens=1 (so the engine's share is one prefill + one token) and up to `--think-ms` of agent
     time between turns, straight to the engine's /generate with the prompt ids the chat template gives,
     and through the proxy's /v1/chat/completions with the same conversations (template,
     token-in/token-out cache, routing, the engine call, recording in Kafka with acks=all, the OpenAI
     response). Same client (httpx) for both; `--rounds` direct and proxied rounds alternate so both
     see the same background load. The added latency is proxy p50 - direct p50 (and p99), plus the
     proxy's CPU time per call (all its threads), which machine load disturbs less. The think time
     keeps the engine below saturation on a small machine (else queueing, not the proxy, dominates).
  2. capacity: `--open-sessions` (1,000) sessions, all in flight at once, two turns each; errors are
     counted and the proxy's resident memory (RSS) is reported before and after.

The floor: `bench/proxy_floor.py`, a server doing only what no proxy with these guarantees can skip (the same
server stack, one engine request, one store transaction, one Kafka record with acks=all, a JSON reply), is run
through the same back-to-back session; its CPU per call is printed under the proxy's, and what the proxy spends
above it is the cost of templating, token-in/token-out, validation, typed events and session bookkeeping.
The floor's own parts are measured the same way, each by a floor without it (`proxy_floor.py --without`): what
the engine request, the store's transaction and the Kafka record cost, and the server with its JSON alone.
Under it, those drift-proof steps timed in process (`bench/proxy_steps.py`) and what is left of the proxy's CPU
beyond floor + steps.

First, right after start-up: the proxy's RSS (at most 250 MB: it imports no torch) and whether torch
is mapped into its process.

    .venv/bin/python bench/adapter_bench.py [--sessions 64] [--turns 8] [--open-sessions 1000] [--profile 20]

`--profile N` runs the proxy under cProfile for the last back-to-back round and prints where its event-loop
thread's CPU goes (docs/benchmarks.md, "adapter_bench.py").

Final line: `ratio proxy/direct p50 latency: X.XXx`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from proxy_floor import PARTS  # noqa: E402  (bench/, the script's directory)
from proxy_steps import STEPS, measure_steps  # noqa: E402

from agents_adapter.proxy.chat_codec import ChatCodec  # noqa: E402
from agents_adapter.proxy.config import AdapterConfig  # noqa: E402
from bus.admin import ensure_topics  # noqa: E402
from bus.config import BusConfig  # noqa: E402
from bus.ports import free_port  # noqa: E402
from bus.topics import TopicSpec  # noqa: E402
from inference_svc.default_model import create_default_model  # noqa: E402
from infra.kafka.cluster import KafkaCluster, free_base_port  # noqa: E402
from infra.launcher import stop_on_sigterm  # noqa: E402

KEY = "bench-key"
FLOOR_TOPIC = "bench.floor"
#: The floors run beside the proxy, by what each leaves out (`proxy_floor.py --without`): "" is the whole floor.
FLOOR_VARIANTS: dict[str, tuple[str, ...]] = {"": (), **{part: (part,) for part in PARTS}, "server": PARTS}
FLOOR_ROUNDS = 4  # back-to-back sessions per floor: their differences are tenths of a millisecond per call
ADMIN = "bench-admin"
WORDS = ("alpha", "beta", "gamma", "delta", "sum", "of", "twelve", "and", "seven", "please", "compute", "then")


# The proxy under cProfile with a CPU-time clock of its own thread (wall time would charge it with the other
# processes of a loaded machine): SIGUSR2 starts a profile, SIGUSR1 writes it to argv[1].
PROFILED_PROXY = """
import cProfile, runpy, signal, sys, time
out, prof = sys.argv[1], cProfile.Profile(time.thread_time)
signal.signal(signal.SIGUSR2, lambda *_: (prof.clear(), prof.enable()))
signal.signal(signal.SIGUSR1, lambda *_: (prof.disable(), prof.dump_stats(out)))
sys.argv = ["agents_adapter.proxy", *sys.argv[2:]]
runpy.run_module("agents_adapter.proxy", run_name="__main__")
"""


def print_profile(path: Path, top: int, calls: int) -> None:
    """The profiled round's costliest functions (own time) and packages, per proxied call."""
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    stats: Any = pstats.Stats(str(path))
    calls = max(1, calls)
    by_package: Counter[str] = Counter()
    for (file, _, name), (_, _, own, _, _) in stats.stats.items():
        found = re.search(r"site-packages/([^/]+)/", file)
        by_package[found.group(1) if found else file.replace(str(REPO) + "/", "") if file != "~" else name] += own
    print(f"\nproxy profile, event-loop thread CPU (cProfile's overhead included): {stats.total_tt / calls * 1000:.2f} "
          f"ms/call over {calls} calls\n{'ms/call':>8}  package or file")
    for where, own in by_package.most_common(top):
        print(f"{own / calls * 1000:>8.3f}  {where}")
    print(f"{'ms/call':>8}  function (own time)")
    for (file, line, name), (_, _, own, _, _) in sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]:
        print(f"{own / calls * 1000:>8.3f}  {file.replace(str(REPO) + '/', '')}:{line}({name})")


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("wb")
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env={**os.environ, **env}, stdout=handle,
                            stderr=subprocess.STDOUT)


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminates the processes a bench started (killed after 15 s)."""
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up; see {log}")


def _error_code(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return response.text[:80]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def conversation(rng: random.Random, turns: int) -> list[list[dict[str, str]]]:
    """The message lists of one session's turns (the assistant replies are filled in as they come)."""
    return [[{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(4, 12)))}] for _ in range(turns)]


Turn = Callable[[int, int, list[dict[str, Any]]], Awaitable[tuple[str, float]]]


async def run_sessions(count: int, turn: Turn, turns: int, seed: int, think_ms: float = 0.0,
                       reasons: Counter[str] | None = None) -> tuple[list[float], int]:
    """`count` concurrent sessions of `turns` sequential requests, each followed by up to `think_ms` of
    agent time (tool calls); latencies (ms) and error count (by reason into `reasons`)."""
    latencies: list[float] = []
    errors = 0

    async def session(i: int) -> None:
        nonlocal errors
        rng = random.Random(seed * 100_003 + i)
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a calculator agent."}]
        for t, new in enumerate(conversation(rng, turns)):
            messages += new
            try:
                reply, latency_ms = await turn(i, t, messages)
            except (httpx.HTTPError, RuntimeError) as e:
                errors += 1
                if reasons is not None:
                    reasons[str(e) if isinstance(e, RuntimeError) else type(e).__name__] += 1
                return
            latencies.append(latency_ms)
            messages.append({"role": "assistant", "content": reply})
            if think_ms:
                await asyncio.sleep(rng.uniform(0, think_ms) / 1000)

    await asyncio.gather(*(session(i) for i in range(count)))
    return latencies, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4, help="direct and proxied rounds, alternated")
    parser.add_argument("--open-sessions", type=int, default=1000)
    parser.add_argument("--sequential-turns", type=int, default=50, help="turns of the back-to-back session")
    parser.add_argument("--think-ms", type=float, default=5000.0,
                        help="agent time between turns, uniform in [0, think-ms] (0: back-to-back calls)")
    parser.add_argument("--bootstrap", default="", help="use this Kafka instead of starting one")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="run the proxy under cProfile (CPU time of its event-loop thread) for the back-to-back "
                             "phase and print its N costliest functions and packages")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="adapter-bench-"))
    stop_on_sigterm()  # `timeout`/`kill` stop the broker and the processes it started too
    cluster = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            cluster = KafkaCluster(work / "kafka", nodes=1, base_port=free_base_port())
            cluster.start()
            bootstrap = cluster.bootstrap_servers
        bus = BusConfig(bootstrap_servers=bootstrap, topic_prefix=f"bench{os.getpid()}.")
        ensure_topics(bus)
        ensure_topics(bus, [TopicSpec(FLOOR_TOPIC, 1, "call", ())])
        model = create_default_model(work / "model")
        codec = ChatCodec.from_model_dir(model)
        engine_port, proxy_port = free_port(), free_port()
        engine_log, proxy_log = work / "engine.log", work / "proxy.log"
        threads = {"OMP_NUM_THREADS": "1"}
        procs.append(start(["-m", "inference_svc", "--model-path", str(model), "--port", str(engine_port),
                            "--max-running-requests", "64", "--num-threads", "1", "--log-level", "warning"],
                           threads, engine_log))
        profiled = ["-c", PROFILED_PROXY, str(work / "proxy.prof")] if args.profile else ["-m", "agents_adapter.proxy"]
        procs.append(start([*profiled, "--model-path", str(model), "--port", str(proxy_port),
                            "--endpoint", f"rollout-0=http://127.0.0.1:{engine_port}", "--no-routing-from-events",
                            "--bootstrap-servers", bootstrap, "--topic-prefix", bus.topic_prefix,
                            "--session-cache-size", str(max(10_000, 2 * args.open_sessions)),
                            "--max-engine-connections", "256", "--log-level", "warning",
                            # every bench session is one agent's: let all of them be in flight at once
                            "--max-inflight-per-agent", str(max(256, args.open_sessions))],
                           threads | {"SFLOW_ADAPTER_API_KEYS": f"bench={KEY}", "SFLOW_ADAPTER_ADMIN_KEY": ADMIN},
                           proxy_log))
        engine_url, proxy_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{proxy_port}"
        floors: dict[str, Floor] = {}
        for variant, left_out in FLOOR_VARIANTS.items():
            floor_port, floor_log = free_port(), work / f"floor-{variant or 'all'}.log"
            procs.append(start(["bench/proxy_floor.py", "--port", str(floor_port), "--engine", engine_url,
                                "--bootstrap-servers", bootstrap, "--topic", bus.topic(FLOOR_TOPIC),
                                *(f"--without={part}" for part in left_out)], threads, floor_log))
            floors[variant] = Floor(f"http://127.0.0.1:{floor_port}", psutil.Process(procs[-1].pid), floor_log)
        wait_http(f"{engine_url}/model_info", procs[0], engine_log)
        wait_http(f"{proxy_url}/health", procs[1], proxy_log)
        for floor, proc in zip(floors.values(), procs[2:], strict=True):
            wait_http(floor.url, proc, floor.log)
        proxy_proc = psutil.Process(procs[1].pid)
        startup_footprint(proxy_proc)
        proxy_config = AdapterConfig(model_path=model)  # the proxy's defaults, for bench/proxy_steps.py
        asyncio.run(measure(args, codec, engine_url, proxy_url, model.name, proxy_proc, floors, proxy_config))
        if args.profile:
            print_profile(work / "proxy.prof", args.profile, args.sequential_turns)
    finally:
        stop_all(procs)
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def thread_cpu(proc: psutil.Process) -> dict[str, float]:
    """CPU ms of the process's threads so far, summed by thread name (librdkafka's, the event loop's, the
    worker threads': where the CPU per call goes besides the profiled event loop).

    Read from `/proc/<pid>/task/<tid>/schedstat` (nanoseconds on a CPU): psutil's times count clock ticks of
    10 ms, which over a 100-call round is a tenth of a millisecond per call, the size of what is compared. Where
    a kernel has no schedstat, psutil's ticks. A thread that ended takes its time with it: the services here keep
    theirs for their life."""
    out: defaultdict[str, float] = defaultdict(float)
    for t in proc.threads():
        task = Path(f"/proc/{proc.pid}/task/{t.id}")
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # the thread ended
        try:
            ms = int((task / "schedstat").read_text().split()[0]) / 1e6
        except (OSError, ValueError, IndexError):
            ms = (t.user_time + t.system_time) * 1000.0
        out[re.sub(r"\d+$", "N", name)] += ms
    return out


def process_cpu_ms(proc: psutil.Process) -> float:
    """CPU ms of all the process's threads so far (`thread_cpu`, summed)."""
    return sum(thread_cpu(proc).values())


def startup_footprint(proxy_proc: psutil.Process) -> None:
    """The proxy's RSS right after start-up (issue 12: <= 250 MB; ~1 GB while it imported torch) and
    whether torch is mapped into it (its shared libraries would be, were torch imported)."""
    rss_mb = proxy_proc.memory_info().rss / 1e6
    torch_libs = sorted({m.path for m in proxy_proc.memory_maps() if "/torch/" in m.path})
    print(f"proxy RSS after start-up: {rss_mb:.1f} MB ({rss_mb * 1e6 / 2**20:.1f} MiB), limit 250 MB: "
          f"{'ok' if rss_mb <= 250 else 'OVER'}")
    print(f"torch loaded in the proxy: {bool(torch_libs)}" + (f" ({torch_libs[0]} ...)" if torch_libs else ""))


@dataclass(frozen=True)
class Floor:
    """A floor server (`bench/proxy_floor.py`), its process and its log."""

    url: str
    proc: psutil.Process
    log: Path


async def measure(args: argparse.Namespace, codec: ChatCodec, engine_url: str, proxy_url: str, model: str,
                  proxy_proc: psutil.Process, floors: dict[str, Floor], proxy_config: AdapterConfig) -> None:
    limits = httpx.Limits(max_connections=args.open_sessions + 64, max_keepalive_connections=args.open_sessions + 64)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as http:

        async def direct(i: int, t: int, messages: list[dict[str, Any]]) -> tuple[str, float]:
            ids = codec.encode(codec.render(messages))  # the agent's own templating: not timed
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                    "return_logprob": True}
            started = time.perf_counter()
            response = await http.post(f"{engine_url}/generate", json=body)
            latency_ms = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                raise RuntimeError(response.text)
            return codec.decode(response.json()["output_ids"]), latency_ms

        def through_proxy(tag: str, url: str = proxy_url) -> Turn:
            async def call(i: int, t: int, messages: list[dict[str, Any]]) -> tuple[str, float]:
                body = {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0.0}
                headers = {"Authorization": f"Bearer {KEY}", "X-Session-Id": f"{tag}-{i}"}
                started = time.perf_counter()
                response = await http.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                latency_ms = (time.perf_counter() - started) * 1000
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code} {_error_code(response)}")
                return str(response.json()["choices"][0]["message"]["content"]), latency_ms

            return call

        await run_sessions(8, direct, 2, seed=0)  # warm-up: connections, engine, Kafka producer
        await run_sessions(8, through_proxy("warm"), 2, seed=0)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine)")
        idle_before = thread_cpu(proxy_proc)
        await asyncio.sleep(3.0)
        idle = {k: v - idle_before.get(k, 0.0) for k, v in thread_cpu(proxy_proc).items()}
        print("proxy CPU while idle, ms/s: " + ", ".join(f"{k} {v / 3:.1f}" for k, v in sorted(idle.items()) if v > 0))
        ratio, proxy_cpu_ms = await latency_table(args, direct, through_proxy, proxy_proc)
        floor_ms = {variant: await floor_cpu_ms(args, through_proxy("floor", floor.url), floor.proc)
                    for variant, floor in floors.items()}
        floor_rows(args, floor_ms, proxy_cpu_ms, codec, proxy_config)
        await capacity(args, http, through_proxy, proxy_url, proxy_proc)
        print(f"\nratio proxy/direct p50 latency: {ratio:.2f}x")


async def latency_table(args: argparse.Namespace, direct: Turn, through_proxy: Callable[[str], Turn],
                        proxy_proc: psutil.Process) -> tuple[float, float]:
    """Direct vs proxied latency, back to back then concurrent; the last phase's p50 ratio and the proxy's
    CPU ms per call back to back."""
    print(f"{'':<40}{'calls':>7}{'errors':>7}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
    ratio = back_to_back_cpu_ms = 0.0
    for phase, (label, sessions, turns, rounds, think) in enumerate((
        ("1 session, back to back", 1, args.sequential_turns, 2, 0.0),
        (f"{args.sessions} sessions, think U[0,{args.think_ms:.0f}]ms", args.sessions, args.turns, args.rounds,
         args.think_ms),
    )):
        direct_ms: list[float] = []
        proxy_ms: list[float] = []
        direct_err = proxy_err = 0
        cpu_ms = 0.0
        by_thread: Counter[str] = Counter()
        for r in range(rounds):  # alternate, so both paths see the same background load
            latencies, errors = await run_sessions(sessions, direct, turns, 1 + r, think)
            direct_ms, direct_err = direct_ms + latencies, direct_err + errors
            if args.profile and phase == 0 and r == rounds - 1:
                proxy_proc.send_signal(signal.SIGUSR2)  # profile the last back-to-back round
            threads_before = thread_cpu(proxy_proc)
            latencies, errors = await run_sessions(sessions, through_proxy(f"lat{phase}-{r}"), turns, 1 + r, think)
            threads_after = thread_cpu(proxy_proc)
            if phase == 0:
                by_thread.update({k: v - threads_before.get(k, 0.0) for k, v in threads_after.items()})
            proxy_ms, proxy_err = proxy_ms + latencies, proxy_err + errors
            cpu_ms += sum(threads_after.values()) - sum(threads_before.values())
        d50, d99, p50, p99 = (percentile(direct_ms, 0.5), percentile(direct_ms, 0.99),
                              percentile(proxy_ms, 0.5), percentile(proxy_ms, 0.99))
        for name, values, errs in ((f"{label}: engine", direct_ms, direct_err),
                                   (f"{label}: proxy", proxy_ms, proxy_err)):
            print(f"{name:<40}{len(values):>7}{errs:>7}{percentile(values, 0.5):>9.2f}"
                  f"{percentile(values, 0.99):>9.2f}{statistics.fmean(values):>9.2f}")
        print(f"{label + ': added by the proxy':<54}{p50 - d50:>9.2f}{p99 - d99:>9.2f}"
              f"   (proxy CPU {cpu_ms / max(1, len(proxy_ms)):.2f} ms/call)")
        ratio = p50 / d50
        if phase == 0:
            back_to_back_cpu_ms = cpu_ms / max(1, len(proxy_ms))
            print("  proxy CPU by thread, ms/call: " + ", ".join(
                f"{name} {ms / max(1, len(proxy_ms)):.2f}" for name, ms in by_thread.most_common(6) if ms > 0))
        if args.profile and phase == 0:
            proxy_proc.send_signal(signal.SIGUSR1)
    return ratio, back_to_back_cpu_ms


async def floor_cpu_ms(args: argparse.Namespace, floor: Turn, floor_proc: psutil.Process) -> float:
    """A floor's CPU per call over the back-to-back session (the proxy's conversations, after a warm-up)."""
    await run_sessions(8, floor, 2, seed=0)
    before = process_cpu_ms(floor_proc)
    calls = 0
    for r in range(FLOOR_ROUNDS):
        latencies, _ = await run_sessions(1, floor, args.sequential_turns, 1 + r)
        calls += len(latencies)
    return (process_cpu_ms(floor_proc) - before) / max(1, calls)


def floor_rows(args: argparse.Namespace, floor_ms: dict[str, float], proxy_cpu_ms: float, codec: ChatCodec,
               proxy_config: AdapterConfig) -> None:
    """The floor, what each of its parts costs (the whole floor less the floor without it), and the proxy's
    drift-proof steps timed in process (`bench/proxy_steps.py`): floor + steps is what the proxy could cost with
    nothing else around them."""
    whole = floor_ms[""]
    print(f"1 session, back to back: floor CPU {whole:.2f} ms/call (bench/proxy_floor.py: server, engine request, "
          f"store, Kafka acks=all); the proxy above it: {proxy_cpu_ms - whole:.2f} ms/call")
    names = {"engine": "engine request", "store": "store transaction", "kafka": "Kafka record acks=all"}
    print("  the floor by part, ms/call (the floor less the floor without it): "
          + ", ".join(f"{names[part]} {whole - floor_ms[part]:.2f}" for part in PARTS)
          + f"; the server and its JSON alone {floor_ms['server']:.2f}")
    steps_ms, _ = measure_steps(codec, proxy_config, args.sequential_turns, 2)
    total = sum(steps_ms[name] for name in STEPS)
    print("  the drift-proof steps, in process (bench/proxy_steps.py), ms/call: "
          + " + ".join(f"{name} {steps_ms[name]:.2f}" for name in STEPS)
          + f" = {total:.2f}; floor + steps {whole + total:.2f}, the rest of the proxy "
          f"{proxy_cpu_ms - whole - total:.2f}")


async def capacity(args: argparse.Namespace, http: httpx.AsyncClient, through_proxy: Callable[[str], Turn],
                   proxy_url: str, proxy_proc: psutil.Process) -> None:
    """`--open-sessions` sessions all in flight at once: errors, latency and the proxy's RSS."""
    rss_before = proxy_proc.memory_info().rss
    started = time.perf_counter()
    reasons: Counter[str] = Counter()
    open_ms, open_err = await run_sessions(args.open_sessions, through_proxy("open"), 2, seed=2, reasons=reasons)
    elapsed = time.perf_counter() - started
    rss_after = proxy_proc.memory_info().rss
    stats = (await http.get(f"{proxy_url}/admin/stats", headers={"Authorization": f"Bearer {ADMIN}"})).json()
    print(f"\n{args.open_sessions} concurrent sessions x 2 turns (all in flight at once)")
    print(f"calls served {len(open_ms)}, errors {open_err}, wall {elapsed:.1f} s, "
          f"p50 {percentile(open_ms, 0.5):.0f} ms, p99 {percentile(open_ms, 0.99):.0f} ms")
    if reasons:
        print("errors by reason: " + ", ".join(f"{why} x{n}" for why, n in reasons.most_common()))
    print(f"proxy sessions cached {stats['sessions']['cached']}, calls recorded {stats['calls_served']}, "
          f"recording failures {stats['recording']['events_failed']}")
    print(f"proxy RSS before {rss_before / 2**20:.1f} MiB, after {rss_after / 2**20:.1f} MiB "
          f"({(rss_after - rss_before) / max(1, args.open_sessions) / 1024:.1f} KiB per session)")


if __name__ == "__main__":
    main()
