"""Long-horizon sessions through the data plane: what a call costs as its session's context grows to 64K tokens.

Starts, on 127.0.0.1 free ports: a one-broker Kafka (KRaft), an edge-fake engine (below) and the capture proxy
(`python -m agents_adapter.proxy`) over a default model written with a 128K-token context
(`max_position_embeddings`, which is where the proxy reads the model's context limit from; `--max-prompt-tokens`
is raised to match). Then `--sessions` agent sessions run in lockstep through the proxy's
`/v1/chat/completions`: each turn appends a tool output (a user message of 100-700 tokens, one turn in twelve
1,000-3,000) and the previous reply, so every session grows from ~1K to 64K tokens over 100+ calls. All sessions
draw the same lengths (their text differs), so every round's calls have one context size and the proxy's CPU over
a round, divided by its calls, is the per-call CPU at that size.

The engine is an EDGE FAKE: a `/generate` server answering every request with the same `--output` tokens at any
context (no model runs; the data plane is what is measured, not inference). The trajectory processor is its
core (`agents_adapter.processor.session_stage.SessionStage` over a dict table, as the Faust worker drives it,
without Faust) in a thread of this process, reading `llm.calls` from Kafka with `bus.consumer.EventConsumer`:
its CPU per call is that thread's CPU for the call's poll + decode + merge + table delta.

Printed against context size (1K, 4K, 16K, 32K, 64K: the 5 rounds whose context is nearest each; CPU as
medians, bytes as means): proxy CPU per call (all its threads, `/proc` schedstat as bench/adapter_bench.py reads
it), bytes per call on `llm.calls` (the record's value), processor CPU per call, time from the call's reply to the
processor's tree holding it; then per session: bytes on `llm.calls`, on disk (the broker's log segments,
lz4-compressed by the producer), the final context's ids, the proxy's memory per open session (RSS growth /
sessions) and the processor's (its trees' arrays).

`--rewrite-every N` then runs as many sessions again on the same tool outputs, each rewriting its history every N
turns as `examples/context_rewriting` does (system prompt, a summary, the last two turns: one fork per rewrite),
and prints their per-call costs beside the growing sessions' and the rewrite calls' alone. `--profile N` runs the
proxy under cProfile for the growing sessions' last 10 rounds (bench/adapter_bench.py's). `--open-sessions N` then
holds N sessions of `--open-context` tokens (16K) open at once (three calls each: a long system prompt, two tool
outputs), prints the proxy's and the processor's memory per open session, and closes the idle ones as the
processor's TTL does.

    .venv/bin/python bench/long_horizon.py [--sessions 4] [--context 65536] [--rewrite-every 10] [--profile 30]
    .venv/bin/python bench/long_horizon.py --sessions 2 --context 4096 --open-sessions 1000 [--open-context 16384]

Final lines: `ratio per-call proxy CPU at 64K / at 1K: N.NNx`, `ratio log bytes / final context bytes per
session: N.NNx`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from adapter_bench import PROFILED_PROXY, print_profile, process_cpu_ms, start, stop_all, wait_http  # noqa: E402  (bench/, the script's directory)

from agents_adapter.processor.config import ProcessorConfig  # noqa: E402
from agents_adapter.processor.session_stage import SessionStage  # noqa: E402
from bus.admin import ensure_topics  # noqa: E402
from bus.config import BusConfig  # noqa: E402
from bus.consumer import EventConsumer, unique_group  # noqa: E402
from bus.ports import free_port  # noqa: E402
from examples.context_rewriting.agent import ContextCompactor  # noqa: E402
from inference_svc.default_model import DefaultModelSpec, create_default_model  # noqa: E402
from infra.kafka.cluster import KafkaCluster, free_base_port  # noqa: E402
from infra.launcher import stop_on_sigterm  # noqa: E402
from schemas.events import LLMCall  # noqa: E402

KEY = "bench-key"
POINTS = (1024, 4096, 16384, 32768, 65536)
WORDS = ("ls", "src/", "def", "class", "return", "import", "error:", "line", "42", "test", "passed", "failed",
         "self", "None", "=", "(", ")", "ok", "file", "diff")


# ---- the edge-fake engine: a raw ASGI app (as bench/proxy_floor.py's) answering a fixed output ----

class FixedOutputEngine:
    """`/generate` answers `output_ids` (finish `length`) whatever the prompt; anything else answers `{}`."""

    def __init__(self, output_ids: list[int]) -> None:
        self.answer = json.dumps({"text": "", "output_ids": output_ids, "meta_info": {
            "id": "fake", "finish_reason": {"type": "length", "length": len(output_ids)},
            "completion_tokens": len(output_ids), "weight_version": "0",
            "output_token_logprobs": [[-0.5, t, None] for t in output_ids],
            "output_token_versions": [0] * len(output_ids)}}).encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        payload = self.answer if scope["path"] == "/generate" else b"{}"
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


def serve_engine(port: int, output_ids: list[int]) -> None:
    import uvicorn
    uvicorn.run(FixedOutputEngine(output_ids), host="127.0.0.1", port=port, log_level="warning")


# ---- the processor core in a thread, reading llm.calls ----

@dataclass
class ProcessorProbe:
    """What the processor thread saw of each call: its record's bytes, its CPU, when its tree held it."""

    bytes_of: dict[str, int] = field(default_factory=dict)
    cpu_ms_of: dict[str, float] = field(default_factory=dict)
    held_at: dict[str, float] = field(default_factory=dict)
    session_bytes: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    dead_letters: list[str] = field(default_factory=list)
    stage: SessionStage | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)  # the consumer has its partitions

    def run(self, bus: BusConfig) -> None:
        config = ProcessorConfig(bus=bus)
        stage = SessionStage(config, {}, _no_publish, config.ticks_topic)
        self.stage = stage
        consumer = EventConsumer(bus, unique_group("long-horizon"), ["llm.calls"])
        loop = asyncio.new_event_loop()
        try:
            while not self.stop.is_set():
                cpu = time.thread_time()
                got = consumer.poll(0.2, max_messages=1)
                if consumer.assigned():
                    self.ready.set()
                for r in got:
                    why = loop.run_until_complete(stage.on_input(r.partition, r.topic, r.event))
                    call = r.event
                    assert isinstance(call, LLMCall)
                    self.cpu_ms_of[call.call_id] = (time.thread_time() - cpu) * 1000
                    self.held_at[call.call_id] = time.time()
                    self.bytes_of[call.call_id] = len(r.raw)
                    self.session_bytes[call.session_id] += len(r.raw)
                    if why:
                        self.dead_letters.append(why)
        finally:
            consumer.close()
            loop.close()

    def tree_bytes(self, prefix: str = "") -> list[int]:
        """Bytes each open session (id starting with `prefix`) holds in the processor: its tree's arrays (ids,
        mask, logprobs, versions of every node) and the copy of its last call's ids."""
        assert self.stage is not None
        out = []
        for part in self.stage._partitions.values():
            for sid, session in list(part.assembler._sessions.items()):
                if sid.startswith(prefix):
                    out.append(len(session.last_call[1]) + sum(
                        n.tokens.nbytes + n.mask.nbytes + n.logprobs.nbytes + n.versions.nbytes
                        for n in session.tree._ordered()))
        return out

    def expire_idle(self, ttl_ms: int) -> int:
        """Closes the sessions idle for `ttl_ms` as the processor's TTL tick does (`TrajectoryAssembler.expire`);
        how many it closed."""
        assert self.stage is not None
        closed = 0
        for part in self.stage._partitions.values():
            before = part.assembler.open_sessions
            part.assembler.expire(int(time.time() * 1000) + ttl_ms + 1, ttl_ms)
            closed += before - part.assembler.open_sessions
        return closed


async def _no_publish(_: object) -> None:
    """Sessions are never closed here (no SessionEnded is sent), so nothing is published."""


# ---- the agent side ----

def tool_lengths(rng: random.Random, context: int, output: int) -> list[int]:
    """Tool-output lengths (tokens) of the turns that take a session from ~1K to `context` tokens."""
    lengths: list[int] = []
    total = 900
    while True:
        n = rng.randint(1_000, 3_000) if rng.random() < 1 / 12 else rng.randint(100, 700)
        if total + n + output + 32 > context - output - 64:
            return lengths
        lengths.append(n)
        total += n + output + 32


def tool_text(rng: random.Random, tokens: int) -> str:
    """About `tokens` tokens of tool output (the default model's tokenizer is one token per byte)."""
    words: list[str] = []
    size = 0
    while size < tokens:
        w = rng.choice(WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:tokens]


@dataclass
class Round:
    context: int  # prompt tokens of this round's calls
    proxy_cpu_ms: float
    call_ids: list[str]
    replied_at: dict[str, float]
    rewrite: bool = False  # the sessions rewrote their history before this round's calls (forks)


async def run_sessions(args: argparse.Namespace, proxy_url: str, model: str, proxy: psutil.Process,
                       output: int, compactor: ContextCompactor | None = None,
                       tag: str = "lh") -> tuple[list[Round], dict[str, int], int]:
    """Lockstep rounds of all sessions (each rewriting its history with `compactor` when due); the rounds, each
    session's final context (tokens) and the proxy's RSS growth (bytes) from before the first call to after the
    last."""
    lengths = tool_lengths(random.Random(args.seed), args.context, output)
    rngs = [random.Random(args.seed * 1000 + i) for i in range(args.sessions)]
    histories: list[list[dict[str, Any]]] = [[
        {"role": "system", "content": "You are a software engineering agent. " + tool_text(rng, 800)}]
        for rng in rngs]
    rounds: list[Round] = []
    final_context: dict[str, int] = {}
    async with httpx.AsyncClient(timeout=600.0) as http:

        async def call(i: int, turn: int, tokens: int) -> tuple[str, int, float]:
            if compactor is not None and compactor.due(turn):
                histories[i] = compactor.rewrite(histories[i])
            histories[i].append({"role": "user", "content": tool_text(rngs[i], tokens)})
            body = {"model": model, "messages": histories[i], "max_tokens": output, "temperature": 1.0}
            response = await http.post(f"{proxy_url}/v1/chat/completions", json=body, headers={
                "Authorization": f"Bearer {KEY}", "X-Session-Id": f"{tag}-{args.seed}-{i}"})
            replied = time.time()
            if response.status_code != 200:
                raise SystemExit(f"HTTP {response.status_code}: {response.text[:300]}")
            answer = response.json()
            histories[i].append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
            usage = answer["usage"]
            final_context[f"{tag}-{args.seed}-{i}"] = usage["prompt_tokens"] + usage["completion_tokens"]
            return answer["sflow"]["call_ids"][0], answer["usage"]["prompt_tokens"], replied

        await call_warm(http, proxy_url, model, output)
        rss_before = proxy.memory_info().rss
        for k, tokens in enumerate([200, *lengths]):
            if args.profile and compactor is None and k == len(lengths) - 9:
                proxy.send_signal(signal.SIGUSR2)
            before = process_cpu_ms(proxy)
            done = await asyncio.gather(*(call(i, k, tokens) for i in range(args.sessions)))
            cpu = process_cpu_ms(proxy) - before
            rounds.append(Round(done[0][1], cpu / len(done), [c for c, _, _ in done], {c: t for c, _, t in done},
                                compactor is not None and compactor.due(k)))
        rss_growth = proxy.memory_info().rss - rss_before
        if args.profile and compactor is None:
            proxy.send_signal(signal.SIGUSR1)
    return rounds, final_context, rss_growth


async def call_warm(http: httpx.AsyncClient, proxy_url: str, model: str, output: int) -> None:
    """Two calls of a short session first: connections, the engine client and the producer are warm."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "warm up"}]
    for _ in range(2):
        response = await http.post(f"{proxy_url}/v1/chat/completions", headers={
            "Authorization": f"Bearer {KEY}", "X-Session-Id": "warm"},
            json={"model": model, "messages": messages, "max_tokens": output})
        messages += [{"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "again"}]


async def open_many(args: argparse.Namespace, proxy_url: str, model: str, proxy: psutil.Process,
                    output: int) -> tuple[list[Round], int]:
    """`--open-sessions` sessions open at once, each three calls to ~`--open-context` tokens (a long system prompt,
    then two tool outputs), at most 64 requests in flight; the rounds and the proxy's RSS growth (bytes)."""
    rng = random.Random(args.seed + 7)
    system = tool_text(rng, args.open_context - 3 * 700 - 2 * output - 64)
    histories = [[{"role": "system", "content": f"session {i}. {system}"}] for i in range(args.open_sessions)]
    gate = asyncio.Semaphore(64)
    rounds: list[Round] = []
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as http:

        async def call(i: int) -> tuple[str, int, float]:
            histories[i].append({"role": "user", "content": tool_text(rng, 700)})
            async with gate:
                response = await http.post(f"{proxy_url}/v1/chat/completions", headers={
                    "Authorization": f"Bearer {KEY}", "X-Session-Id": f"open-{args.seed}-{i}"},
                    json={"model": model, "messages": histories[i], "max_tokens": output})
            if response.status_code != 200:
                raise SystemExit(f"HTTP {response.status_code}: {response.text[:300]}")
            answer = response.json()
            histories[i].append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
            return answer["sflow"]["call_ids"][0], answer["usage"]["prompt_tokens"], time.time()

        rss_before = proxy.memory_info().rss
        for _ in range(3):
            before = process_cpu_ms(proxy)
            done = await asyncio.gather(*(call(i) for i in range(args.open_sessions)))
            cpu = process_cpu_ms(proxy) - before
            rounds.append(Round(done[0][1], cpu / len(done), [c for c, _, _ in done], {c: t for c, _, t in done}))
    return rounds, proxy.memory_info().rss - rss_before


def report_open(rounds: list[Round], probe: ProcessorProbe, proxy_rss_growth: int, sessions: int,
                ttl_ms: int) -> None:
    """Memory per open session, then the processor's TTL closing the idle ones."""
    held = probe.tree_bytes("open-")
    context = rounds[-1].context + 64
    print(f"\n{sessions} sessions open at once, ~{context} tokens each (3 calls; CPU per call: proxy "
          f"{per_call(rounds, probe)[0]:.2f} ms, processor {per_call(rounds, probe)[2]:.2f} ms)")
    print(f"memory per open session: proxy {proxy_rss_growth / sessions / 2**20:.2f} MiB (RSS growth / sessions), "
          f"processor {statistics.fmean(held) / 2**20:.2f} MiB (tree arrays + the last call's ids); "
          f"the session's ids alone: {context * 4 / 2**20:.2f} MiB")
    closed = probe.expire_idle(ttl_ms)
    print(f"idle past the processor's ttl_ms={ttl_ms}: {closed} open sessions (all) closed as trajectories, "
          f"{len(probe.tree_bytes('open-'))} still held")


def wait_for_processor(probe: ProcessorProbe, rounds: list[Round]) -> None:
    wanted = {c for r in rounds for c in r.call_ids}
    deadline = time.monotonic() + 120
    while not wanted <= probe.held_at.keys() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not wanted <= probe.held_at.keys():
        raise SystemExit(f"the processor saw {len(wanted & probe.held_at.keys())} of {len(wanted)} calls")


def log_bytes_on_disk(kafka_root: Path, topic: str) -> int:
    """Bytes of the topic's log segments on the broker (what the producer's lz4 batches take on disk)."""
    return sum(f.stat().st_size for d in kafka_root.rglob(f"{topic}-*") if d.is_dir() for f in d.glob("*.log"))


def nearest_rounds(rounds: list[Round], point: int, width: int = 5) -> list[Round]:
    """The `width` rounds whose context is nearest `point` tokens."""
    return sorted(rounds, key=lambda r: abs(r.context - point))[:width]


def per_call(rounds: list[Round], probe: ProcessorProbe) -> tuple[float, float, float]:
    """Proxy CPU ms, llm.calls bytes and processor CPU ms per call over `rounds`: medians (of the rounds' per-call
    CPU, of the calls' CPU), since a shared machine's load and a garbage collection make single calls spike."""
    ids = [c for r in rounds for c in r.call_ids]
    return (statistics.median(r.proxy_cpu_ms for r in rounds), statistics.fmean(probe.bytes_of[c] for c in ids),
            statistics.median(probe.cpu_ms_of[c] for c in ids))


def report(rounds: list[Round], probe: ProcessorProbe, final_context: dict[str, int], disk_bytes: int,
           proxy_rss_growth: int, sessions: int) -> None:
    print(f"engine: EDGE FAKE (a fixed output at any context); measured: proxy, Kafka, processor core\n"
          f"{sessions} sessions x {len(rounds)} calls, lockstep\n")
    print(f"{'context':>8}{'rounds':>7}{'proxy CPU ms/call':>19}{'llm.calls B/call':>18}{'processor CPU ms/call':>23}"
          f"{'reply->tree ms p50':>20}")
    for point in POINTS:
        near = nearest_rounds(rounds, point)
        proxy_ms, size, proc_ms = per_call(near, probe)
        lag = statistics.median((probe.held_at[c] - r.replied_at[c]) * 1000 for r in near for c in r.call_ids)
        ctx = statistics.fmean(r.context for r in near)
        print(f"{ctx:>8.0f}{len(near):>7}{proxy_ms:>19.2f}{size:>18.0f}{proc_ms:>23.2f}{lag:>20.1f}")
    log_total = sum(probe.session_bytes[s] for s in final_context)
    final_bytes = sum(final_context.values()) * 4
    trees = probe.tree_bytes()
    print(f"\nper session: {log_total / sessions / 1e6:.2f} MB on llm.calls, {disk_bytes / sessions / 1e6:.2f} MB on "
          f"disk (lz4), final context {final_bytes / sessions / 1e3:.0f} KB of ids "
          f"({statistics.fmean(final_context.values()):.0f} tokens)")
    print(f"memory per open session: proxy {proxy_rss_growth / sessions / 2**20:.2f} MiB (RSS growth / sessions), "
          f"processor {statistics.fmean(trees) / 2**20:.2f} MiB (tree arrays)")
    print(f"dead letters: {len(probe.dead_letters)}")


def report_rewriting(growing: list[Round], rewriting: list[Round], probe: ProcessorProbe, every: int) -> None:
    """Per call, all calls: growing sessions vs sessions that rewrite their history every `every` turns (same
    tool outputs), and the rewrite calls (forks) alone."""
    print(f"\nrewriting every {every} turns (examples/context_rewriting), per call over all calls (CPU: medians):")
    print(f"{'sessions':<28}{'calls':>7}{'context':>9}{'proxy CPU ms':>14}{'llm.calls B':>13}{'processor CPU ms':>18}")
    forks = [r for r in rewriting if r.rewrite]
    for label, rounds in (("growing", growing), ("rewriting", rewriting), ("rewriting: the forks alone", forks)):
        proxy_ms, size, proc_ms = per_call(rounds, probe)
        calls = sum(len(r.call_ids) for r in rounds)
        ctx = statistics.fmean(r.context for r in rounds)
        print(f"{label:<28}{calls:>7}{ctx:>9.0f}{proxy_ms:>14.2f}{size:>13.0f}{proc_ms:>18.2f}")


def print_ratios(rounds: list[Round], probe: ProcessorProbe, final_context: dict[str, int]) -> None:
    at_1k, at_64k = (per_call(nearest_rounds(rounds, p), probe) for p in (POINTS[0], POINTS[-1]))
    log_total = sum(probe.session_bytes[s] for s in final_context)
    print(f"\nratio per-call processor CPU at 64K / at 1K: {at_64k[2] / at_1k[2]:.2f}x")
    print(f"ratio per-call proxy CPU at 64K / at 1K: {at_64k[0] / at_1k[0]:.2f}x")
    print(f"ratio log bytes / final context bytes per session: {log_total / (sum(final_context.values()) * 4):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--context", type=int, default=65536, help="tokens each session grows to")
    parser.add_argument("--output", type=int, default=64, help="tokens the fake engine answers per call")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rewrite-every", type=int, default=0, metavar="N",
                        help="then run as many sessions again, rewriting their history every N turns "
                             "(examples/context_rewriting), and compare their per-call costs")
    parser.add_argument("--open-sessions", type=int, default=0, metavar="N",
                        help="then hold N sessions of --open-context tokens open at once and print memory per session")
    parser.add_argument("--open-context", type=int, default=16384)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="run the proxy under cProfile for the last 10 rounds and print its N costliest functions")
    parser.add_argument("--serve-engine", type=int, default=0, help=argparse.SUPPRESS)  # the fake engine's process
    parser.add_argument("--output-ids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_engine:
        serve_engine(args.serve_engine, [int(t) for t in args.output_ids.split(",")])
        return
    longest = max(args.context, args.open_context if args.open_sessions else 0)
    work = Path(tempfile.mkdtemp(prefix="long-horizon-"))
    stop_on_sigterm()
    cluster = KafkaCluster(work / "kafka", nodes=1, base_port=free_base_port())
    procs: list[subprocess.Popen[bytes]] = []
    probe = ProcessorProbe()
    try:
        cluster.start()
        bus = BusConfig(bootstrap_servers=cluster.bootstrap_servers, topic_prefix=f"lh{os.getpid()}.")
        ensure_topics(bus)
        model = create_default_model(work / "model", DefaultModelSpec(max_position_embeddings=2 * longest))
        from agents_adapter.proxy.chat_codec import ChatCodec
        output_ids = ChatCodec.from_model_dir(model).encode(tool_text(random.Random(0), args.output))
        engine_port, proxy_port = free_port(), free_port()
        procs.append(start(["bench/long_horizon.py", "--serve-engine", str(engine_port), "--output-ids",
                            ",".join(map(str, output_ids))], {}, work / "engine.log"))
        proxy_cmd = ["-c", PROFILED_PROXY, str(work / "proxy.prof")] if args.profile else ["-m", "agents_adapter.proxy"]
        procs.append(start([*proxy_cmd, "--model-path", str(model), "--port", str(proxy_port),
                            "--endpoint", f"rollout-0=http://127.0.0.1:{engine_port}", "--no-routing-from-events",
                            "--bootstrap-servers", cluster.bootstrap_servers, "--topic-prefix", bus.topic_prefix,
                            "--max-prompt-tokens", str(longest + 1024), "--log-level", "warning",
                            "--max-inflight-per-agent", "1024"],
                           {"SFLOW_ADAPTER_API_KEYS": f"bench={KEY}", "OMP_NUM_THREADS": "1"}, work / "proxy.log"))
        wait_http(f"http://127.0.0.1:{engine_port}/health", procs[0], work / "engine.log")
        wait_http(f"http://127.0.0.1:{proxy_port}/health", procs[1], work / "proxy.log")
        thread = threading.Thread(target=probe.run, args=(bus,), daemon=True)
        thread.start()
        if not probe.ready.wait(60):
            raise SystemExit("the processor's consumer got no partitions in 60 s")
        proxy = psutil.Process(procs[1].pid)
        proxy_url = f"http://127.0.0.1:{proxy_port}"
        rounds, final_context, rss_growth = asyncio.run(run_sessions(args, proxy_url, model.name, proxy, args.output))
        wait_for_processor(probe, rounds)
        disk_bytes = log_bytes_on_disk(work / "kafka", bus.topic("llm.calls"))
        rewriting: list[Round] = []
        if args.rewrite_every:
            rewriting, _, _ = asyncio.run(run_sessions(args, proxy_url, model.name, proxy, args.output,
                                                       ContextCompactor(args.rewrite_every), tag="rw"))
            wait_for_processor(probe, rewriting)
        if args.profile:
            print_profile(work / "proxy.prof", args.profile, 10 * args.sessions)
        report(rounds, probe, final_context, disk_bytes, rss_growth, args.sessions)
        if rewriting:
            report_rewriting(rounds, rewriting, probe, args.rewrite_every)
        opened, open_rss = asyncio.run(open_many(args, proxy_url, model.name, proxy, args.output)) \
            if args.open_sessions else ([], 0)
        wait_for_processor(probe, opened)
        probe.stop.set()
        thread.join(10)
        if opened:
            report_open(opened, probe, open_rss, args.open_sessions, ProcessorConfig(bus=bus).ttl_ms)
        print_ratios(rounds, probe, final_context)
    finally:
        probe.stop.set()
        stop_all(procs)
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
