"""SeamlessFlow's capture proxy side by side with the peers' gateways: CPU per call, added latency, memory,
and what each records, in front of one upstream on the same multi-turn tool sessions.

The gateways, each its own process (so its CPU is its own), each with uvicorn on uvloop and httptools, logs
at warning and no access log:

- **SeamlessFlow** (`python -m agents_adapter.proxy`): templates the chat, calls SGLang's `/generate` with
  token ids, records every call as an `LLMCall` (exact prompt and output ids, per-token policy versions) in
  Kafka with `acks=all` *before* it replies; its one-broker Kafka (KRaft) runs beside it, and the broker's
  CPU per call is printed under the proxy's.
- **rllm-model-gateway** (`rllm-model-gateway`, PyPI; the `peers` extra): forwards OpenAI chat to a vLLM
  `/v1/chat/completions` with `logprobs` and `return_token_ids`, records the ids the engine returns in
  SQLite: after the reply by default (`sync_traces: false`), before it with `--rllm-sync` (one more row).
- **Agent Lightning** (`agentlightning`, PyPI; needs Python >= 3.12, so this bench installs it in its own
  venv under `var/peers/`, from the first Python 3.12 it finds or `--peer-python`): its server's LLM proxy
  (`/proxy/rollout/{rollout}/attempt/{attempt}/mode/train/openai/v1/chat/completions`), which records each
  request and response (ids included) as an event of the rollout in the server's memory.

The upstream is `bench/fake_upstream.py`, an edge fake (zero compute, `--latency-ms` fixed latency) that
answers both SGLang `/generate` and vLLM-style chat with token ids, with the served model's tokenizer and
chat template (the default model's). Every session is the same scripted tool session: `--tool-turns`
calculator calls, each answered with a tool result, then the final answer (`--tool-turns` + 1 calls).

Per gateway, after a warm-up: `--sequential` sessions back to back (one call in flight), then `--rounds`
rounds of `--sessions` (64) concurrent sessions. Each gateway round alternates with a direct round (the
same sessions straight to the upstream API that gateway calls: `/generate` with the chat template's ids for
SeamlessFlow, templated by the client and not timed, `/v1/chat/completions` for the peers), so the added
latency is gateway minus direct (p50, p99) under the same background load. CPU per call is the gateway
process's CPU over its rounds (all threads, from `/proc/<pid>/task/*/schedstat`: `adapter_bench.thread_cpu`)
divided by the calls served. Memory is the process's RSS after start-up and at the end. What each recorded
is read back from its own store after the run (Kafka, SQLite, the server's events API) and checked against
what the upstream answered.

    .venv/bin/python bench/vs_gateways.py [--sessions 64] [--rounds 2] [--sequential 25] [--tool-turns 3]
        [--latency-ms 20] [--rllm-sync] [--peer-python /path/to/python3.12] [--only sflow,rllm,agl]

Final line: `ratio CPU per call, best peer / SeamlessFlow: N.NNx` (the concurrent phase: the load an RL
rollout puts on a gateway; the back-to-back phase's ratio is printed above it).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import importlib.metadata
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from adapter_bench import percentile, process_cpu_ms, start, thread_cpu, wait_http  # noqa: E402  (bench/, here)
from fake_upstream import ANSWER, WEIGHT_VERSION, Script  # noqa: E402

from agents_adapter.proxy.chat_codec import ChatCodec  # noqa: E402
from agents_adapter.proxy.outputs import parse_tool_calls  # noqa: E402
from bus.admin import ensure_topics  # noqa: E402
from bus.config import BusConfig  # noqa: E402
from bus.ports import free_port  # noqa: E402
from bus.replay import replay  # noqa: E402
from examples.calculator.tool import CALCULATOR_TOOL  # noqa: E402
from inference_svc.default_model import create_default_model  # noqa: E402
from infra.kafka.cluster import KafkaCluster, free_base_port  # noqa: E402
from infra.launcher import stop_on_sigterm  # noqa: E402
from schemas.events import LLMCall  # noqa: E402

KEY: Final = "bench-key"
ADMIN: Final = "bench-admin"
AGL_VERSION: Final = "1.0.2"
RLLM_VERSION: Final = "0.1.0"
PEER_VENVS: Final = REPO / "var" / "peers"
SYSTEM: Final = "You solve arithmetic problems. Call the calculator tool to compute, then reply with the final number."
MAX_TOKENS: Final = 128
#: The peers' apps under the same uvicorn settings as the proxy (warning logs, no access log); Agent Lightning's
#: structlog is set to warning too (its default prints a debug line per proxied call).
PEER_SERVER: Final = """
import json, logging, sys, uvicorn
kind, port, config = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
if kind == "rllm":
    from rllm_model_gateway.models import GatewayConfig
    from rllm_model_gateway.server import create_app
    app = create_app(GatewayConfig(**config))
else:
    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from agentlightning.server.app import create_app
    app = create_app(config)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=60)
"""

Message = dict[str, Any]
#: One call of a session: (session index, messages so far) -> (the assistant message, latency ms).
Turn = Callable[[int, list[Message]], Awaitable[tuple[Message, float]]]


@dataclass
class Gateway:
    """A gateway under test: how a session's call reaches it, and what it records."""

    kind: str  # "sflow", "rllm" or "agl"
    name: str
    version: str
    proc: psutil.Process
    url: str
    upstream_api: str  # "generate" or "chat": the upstream API it calls (its direct baseline)
    records: str  # what it records, as its code does (read from the installed package)
    settings: str  # how it runs here, where that differs from its defaults or from the others
    rss_start_mb: float = 0.0
    served: dict[str, int] = field(default_factory=dict)  # phase tag -> calls served
    sessions: dict[str, int] = field(default_factory=dict)  # phase tag -> sessions it ran

    def path(self, tag: str, i: int) -> tuple[str, dict[str, str]]:
        """The chat completions URL and headers of session `i` of a phase."""
        sid = f"{tag}-{i}"
        if self.kind == "rllm":
            return f"{self.url}/sessions/{sid}/v1/chat/completions", {}
        if self.kind == "agl":
            return (f"{self.url}/proxy/rollout/{sid}/attempt/0/mode/train/openai/v1/chat/completions",
                    {"Authorization": f"Bearer {KEY}"})
        return f"{self.url}/v1/chat/completions", {"Authorization": f"Bearer {KEY}", "X-Session-Id": sid}

    async def prepare(self, http: httpx.AsyncClient, tag: str, count: int) -> None:
        """Agent Lightning proxies only for rollouts it knows: they are created first (not measured)."""
        self.sessions[tag] = count
        if self.kind == "agl":
            rows = [{"input": {"session": i}, "rollout_id": f"{tag}-{i}"} for i in range(count)]
            reply = await http.post(f"{self.url}/api/rollouts", json=rows, headers={"Authorization": f"Bearer {KEY}"})
            reply.raise_for_status()


@dataclass
class Phase:
    """One measured phase of one gateway: latencies of both paths, the gateway's CPU, calls, errors."""

    direct_ms: list[float] = field(default_factory=list)
    gateway_ms: list[float] = field(default_factory=list)
    cpu_ms: float = 0.0
    by_thread: Counter[str] = field(default_factory=Counter)  # the gateway's CPU ms by thread name
    broker_cpu_ms: float = 0.0
    errors: int = 0

    def cpu_per_call(self) -> float:
        return self.cpu_ms / max(1, len(self.gateway_ms))

    def added(self, q: float) -> float:
        return percentile(self.gateway_ms, q) - percentile(self.direct_ms, q)


def tool_result(call: dict[str, Any]) -> Message:
    return {"role": "tool", "tool_call_id": call.get("id", ""), "content": ANSWER}


async def run_sessions(count: int, turn: Turn, max_calls: int, think_ms: float = 0.0) -> tuple[list[float], int]:
    """`count` concurrent tool sessions: a call, its tool calls answered (after up to `think_ms` of tool time,
    uniform, the same draws on every path), the next call, until a reply without tool calls (or `max_calls`);
    with a think time, sessions start spread over one. Latencies (ms) and the number of sessions that failed."""
    latencies: list[float] = []
    errors = 0

    async def session(i: int) -> None:
        nonlocal errors
        rng = random.Random(i)
        messages: list[Message] = [{"role": "system", "content": SYSTEM},
                                   {"role": "user", "content": f"What is 12 + 7? (session {i})"}]
        if think_ms:  # sessions start spread over a think time, as in a steady state, not in one burst
            await asyncio.sleep(rng.uniform(0, think_ms) / 1000)
        for _ in range(max_calls):
            try:
                message, latency_ms = await turn(i, messages)
            except (httpx.HTTPError, RuntimeError, KeyError, ValueError):
                errors += 1
                return
            latencies.append(latency_ms)
            messages.append(message)
            if not message.get("tool_calls"):
                return
            messages += [tool_result(call) for call in message["tool_calls"]]
            if think_ms:
                await asyncio.sleep(rng.uniform(0, think_ms) / 1000)

    await asyncio.gather(*(session(i) for i in range(count)))
    return latencies, errors


async def timed_post(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                     headers: dict[str, str] | None = None) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    response = await http.post(url, json=body, headers=headers)
    latency_ms = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
    return response.json(), latency_ms


def chat_body(model: str, messages: list[Message]) -> dict[str, Any]:
    return {"model": model, "messages": messages, "tools": [CALCULATOR_TOOL], "max_tokens": MAX_TOKENS,
            "temperature": 0.0}


def turns(http: httpx.AsyncClient, codec: ChatCodec, model: str, upstream: str) -> dict[str, Callable[..., Turn]]:
    """The turn functions: straight to the upstream's two APIs, and through a gateway."""

    async def generate(i: int, messages: list[Message]) -> tuple[Message, float]:
        ids = codec.encode(codec.render(messages, [CALCULATOR_TOOL]))  # the client's templating: not timed
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0.0},
                "return_logprob": True}
        reply, latency_ms = await timed_post(http, f"{upstream}/generate", body)
        text = codec.decode([i for i in reply["output_ids"] if i not in codec.eos_token_ids])
        parsed = parse_tool_calls(text, codec.tool_call_style)
        if parsed is None:
            return {"role": "assistant", "content": text}, latency_ms
        return {"role": "assistant", "content": parsed[0] or None, "tool_calls": parsed[1]}, latency_ms

    async def chat(i: int, messages: list[Message]) -> tuple[Message, float]:
        body = {**chat_body(model, messages), "logprobs": True, "return_token_ids": True}  # as the peers ask
        reply, latency_ms = await timed_post(http, f"{upstream}/v1/chat/completions", body)
        return reply["choices"][0]["message"], latency_ms

    def through(gateway: Gateway, tag: str) -> Turn:
        async def call(i: int, messages: list[Message]) -> tuple[Message, float]:
            url, headers = gateway.path(tag, i)
            reply, latency_ms = await timed_post(http, url, chat_body(model, messages), headers)
            gateway.served[tag] = gateway.served.get(tag, 0) + 1
            return reply["choices"][0]["message"], latency_ms

        return call

    return {"generate": lambda: generate, "chat": lambda: chat, "through": through}


async def measure(gateway: Gateway, args: argparse.Namespace, http: httpx.AsyncClient, codec: ChatCodec,
                  model: str, upstream: str, broker: psutil.Process | None) -> dict[str, Phase]:
    """The back-to-back and the concurrent phase of one gateway (after a warm-up)."""
    fns = turns(http, codec, model, upstream)
    direct: Turn = fns[gateway.upstream_api]()
    calls = args.tool_turns + 1
    await gateway.prepare(http, "warm", 8)
    await run_sessions(8, fns["through"](gateway, "warm"), calls)
    await run_sessions(8, direct, calls)
    phases: dict[str, Phase] = {}
    for label, sessions, rounds, think in (("back to back", 1, args.sequential, 0.0),
                                           (f"{args.sessions} concurrent", args.sessions, args.rounds, args.think_ms)):
        phase = phases[label] = Phase()
        for r in range(rounds):  # alternated, so that both paths see the same background load
            latencies, _ = await run_sessions(sessions, direct, calls, think)
            phase.direct_ms += latencies
            tag = f"{'seq' if sessions == 1 else 'conc'}-{r}"
            await gateway.prepare(http, tag, sessions)
            before, broker_before = thread_cpu(gateway.proc), process_cpu_ms(broker) if broker else 0.0
            latencies, errors = await run_sessions(sessions, fns["through"](gateway, tag), calls, think)
            after = thread_cpu(gateway.proc)
            phase.by_thread.update({name: ms - before.get(name, 0.0) for name, ms in after.items()})
            phase.cpu_ms += sum(after.values()) - sum(before.values())
            phase.broker_cpu_ms += (process_cpu_ms(broker) - broker_before) if broker else 0.0
            phase.gateway_ms += latencies
            phase.errors += errors
    return phases


# ----- what each gateway recorded, read back from its own store


async def recorded(gateway: Gateway, http: httpx.AsyncClient, script: Script, bus: BusConfig | None) -> str:
    """Calls recorded / served, and whether the recorded output ids are the upstream's exactly."""
    served = sum(gateway.served.values())
    outputs = {tuple(script.tool_call_ids), tuple(script.answer_ids)}
    if bus is not None:
        calls = [r.event for r in replay(bus, ["llm.calls"]).events if isinstance(r.event, LLMCall)]
        exact = all(tuple(c.output_ids.tolist()) in outputs and len(c.prompt_ids) for c in calls)
        versioned = all(set(c.output_versions.tolist()) == {WEIGHT_VERSION} for c in calls)
        return (f"{len(calls)}/{served}; output ids exact: {'yes' if exact else 'NO'} (all); "
                f"per-token versions: {'yes' if versioned else 'NO'}")
    if gateway.kind == "rllm":
        deadline, sessions = time.monotonic() + 30, []
        while time.monotonic() < deadline:  # its default writes each trace after the reply: wait for them
            sessions = (await http.get(f"{gateway.url}/sessions")).json()
            if sum(int(s["trace_count"]) for s in sessions) >= served:
                break
            await asyncio.sleep(0.2)
        traces = [t for s in sessions[:8] for t in (await http.get(
            f"{gateway.url}/sessions/{s['session_id']}/traces")).json()]
        exact = all(tuple(t["completion_token_ids"]) in outputs and t["prompt_token_ids"] for t in traces)
        return (f"{sum(int(s['trace_count']) for s in sessions)}/{served}; output ids exact: "
                f"{'yes' if exact else 'NO'} ({len(traces)} checked); no versions")
    events = []
    for tag, count in gateway.sessions.items():
        for i in range(count):
            reply = await http.get(f"{gateway.url}/api/rollouts/{tag}-{i}/events", params={"format": "triplet"},
                                   headers={"Authorization": f"Bearer {KEY}"})
            if reply.status_code != 200:
                raise SystemExit(f"{reply.url}: {reply.status_code} {reply.text[:300]}")
            events += [e["data"] for e in reply.json() if e["event_type"] == "model_request"]
    exact = all(tuple(e["response_token_ids"]) in outputs and e["prompt_token_ids"] for e in events)
    versioned = all(e["server"]["version"] == WEIGHT_VERSION for e in events)
    return (f"{len(events)}/{served}; output ids exact: {'yes' if exact else 'NO'} (all); "
            f"version per call (registered): {'yes' if versioned else 'NO'}")


# ----- starting the processes


def peer_python(args: argparse.Namespace) -> Path | None:
    """Agent Lightning's venv (Python >= 3.12), created and installed on the first run; None (said why) where
    no Python >= 3.12 is found or the install fails: the other gateways are measured without it."""
    target = PEER_VENVS / f"agentlightning-{AGL_VERSION}"
    python = target / "bin" / "python"
    probe = [str(python), "-c", "import agentlightning.server.app, uvloop, httptools"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    base = next((c for c in python312_candidates(args.peer_python) if subprocess.run(
        [c, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"], capture_output=True).returncode == 0), None)
    if base is None:
        print(f"Agent Lightning skipped: agentlightning {AGL_VERSION} needs Python >= 3.12, none found "
              "(give one with --peer-python)", flush=True)
        return None
    print(f"installing agentlightning=={AGL_VERSION} into {target} (Python {base}) ...", flush=True)
    # the same server stack as the others: uvicorn on uvloop and httptools, at this venv's versions
    stack = [f"{name}=={importlib.metadata.version(name)}" for name in ("uvloop", "httptools")]
    try:
        subprocess.run([base, "-m", "venv", str(target)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"agentlightning=={AGL_VERSION}", *stack],
                       check=True)
    except subprocess.CalledProcessError as e:
        print(f"Agent Lightning skipped: installing it into {target} failed ({e})", flush=True)
        return None
    return python


def python312_candidates(given: str) -> list[str]:
    """Where a Python 3.12 may be: the one given, pyenv's installs, then PATH (a pyenv shim there may fail)."""
    found = [given] if given else []
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    return found + [p for name in ("python3.12", "python3.13") if (p := shutil.which(name))]


def versions_of(python: Path, names: tuple[str, ...]) -> str:
    code = ("import importlib.metadata as m, sys; print(sys.version.split()[0], "
            f"*[n + '=' + m.version(n) for n in {list(names)!r}])")
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def start_peer(python: Path, kind: str, config: dict[str, Any], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([str(python), "-c", PEER_SERVER, kind, str(port), json.dumps(config)], cwd=log.parent,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


@dataclass
class Started:
    """The processes a run started, to stop at its end."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cluster: KafkaCluster | None = None

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.cluster is not None:
            self.cluster.stop()


def start_gateways(args: argparse.Namespace, work: Path, model: Path, upstream: str, started: Started
                   ) -> tuple[list[Gateway], BusConfig | None]:
    """Every gateway asked for, each in front of the upstream, each ready."""
    pending: list[tuple[Gateway, subprocess.Popen[bytes], str, Path]] = []
    bus = None
    env = {"OMP_NUM_THREADS": "1"}
    if "sflow" in args.only:
        started.cluster = KafkaCluster(work / "kafka", nodes=1, base_port=free_base_port())
        started.cluster.start()
        bus = BusConfig(bootstrap_servers=started.cluster.bootstrap_servers, topic_prefix=f"vsgw{os.getpid()}.")
        ensure_topics(bus)
        port, log = free_port(), work / "sflow.log"
        proc = start(["-m", "agents_adapter.proxy", "--model-path", str(model), "--port", str(port),
                      "--endpoint", f"rollout-0={upstream}", "--no-routing-from-events",
                      "--bootstrap-servers", bus.bootstrap_servers, "--topic-prefix", bus.topic_prefix,
                      "--max-engine-connections", "256", "--log-level", "warning", "--max-inflight-per-agent", "256"],
                     env | {"SFLOW_ADAPTER_API_KEYS": f"bench={KEY}", "SFLOW_ADAPTER_ADMIN_KEY": ADMIN}, log)
        started.procs.append(proc)  # stopped at the end even if a later start fails
        pending.append((Gateway(
            "sflow", "SeamlessFlow proxy", versions_of(Path(sys.executable), ("uvicorn", "confluent-kafka")),
            psutil.Process(proc.pid), f"http://127.0.0.1:{port}", "generate",
            "LLMCall per call: exact prompt + output ids, logprobs, per-token policy versions; Kafka acks=all "
            "(idempotent) before the reply",
            "SGLang /generate (token in/out, its own chat template + tokenizer); one-broker KRaft Kafka beside it; "
            "bearer key checked"), proc, "/health", log))
    rllm_configs = [("rllm-model-gateway", False), *([("rllm-model-gateway sync", True)] if args.rllm_sync else [])]
    rllm_installed = importlib.util.find_spec("rllm_model_gateway") is not None
    if "rllm" in args.only and not rllm_installed:
        print(f"rllm-model-gateway skipped: not installed (pip install -e '.[peers]': "
              f"rllm-model-gateway=={RLLM_VERSION})")
    for name, sync in rllm_configs if "rllm" in args.only and rllm_installed else []:
        stem = work / name.replace(" ", "-")
        config = {"workers": [{"url": f"{upstream}/v1", "worker_id": "0"}], "db_path": f"{stem}.db",
                  "store_worker": "sqlite", "log_level": "WARNING", "sync_traces": sync,
                  "health_check_interval": 10.0}
        proc, url = start_peer(Path(sys.executable), "rllm", config, Path(f"{stem}.log"))
        started.procs.append(proc)
        pending.append((Gateway(
            "rllm", name, versions_of(Path(sys.executable), ("rllm-model-gateway", "uvicorn", "aiosqlite")),
            psutil.Process(proc.pid), url, "chat",
            "trace per call in SQLite (journal DELETE, synchronous NORMAL): ids the engine returned, logprobs, "
            "messages, raw request + response; " + ("committed before the reply (sync_traces)" if sync else
                                                    "written after the reply (sync_traces false, its default)"),
            "vLLM /v1/chat/completions (+logprobs, return_token_ids); no auth (it has none)"), proc, "/health",
            Path(f"{stem}.log")))
    python = peer_python(args) if "agl" in args.only else None
    if python is not None:
        config = {"host": "127.0.0.1", "port": 0, "key": KEY, "default_proxy": {
            "model_name": model.name, "include_log_probs": True, "include_routed_experts": False,
            "train": {"temperature": 0.0}, "val": {"temperature": 0.0}}}
        proc, url = start_peer(python, "agl", config, work / "agl.log")
        started.procs.append(proc)
        pending.append((Gateway(
            "agl", "Agent Lightning proxy", versions_of(python, ("agentlightning", "uvicorn")),
            psutil.Process(proc.pid), url, "chat",
            "model_request event per call in the server's memory (request + response JSON: ids the engine "
            "returned, logprobs; the registered model version per call); nothing on disk",
            "vLLM /v1/chat/completions (+logprobs, return_token_ids, temperature from its config); bearer key "
            "checked; its own venv (Python >= 3.12); structlog at warning"), proc, "/healthz", work / "agl.log"))
    for gateway, proc, health, log in pending:
        wait_http(f"{gateway.url}{health}", proc, log)
        gateway.rss_start_mb = gateway.proc.memory_info().rss / 2**20
        if gateway.kind == "agl":
            httpx.post(f"{gateway.url}/api/models", headers={"Authorization": f"Bearer {KEY}"},
                       json=[{"model": model.name, "endpoint": f"{upstream}/v1", "version": WEIGHT_VERSION}]
                       ).raise_for_status()
    return [g for g, *_ in pending], bus


# ----- the run


def print_results(gateways: list[Gateway], results: dict[str, dict[str, Phase]], records: dict[str, str],
                  broker: bool) -> float:
    """The table; returns the concurrent phase's ratio of CPU per call, best peer / SeamlessFlow."""
    print(f"\n{'gateway':<26}{'phase':<15}{'calls':>6}{'err':>4}{'CPU ms/call':>12}"
          f"{'added p50 ms':>13}{'added p99 ms':>13}{'direct p50':>11}{'direct calls':>13}")
    for g in gateways:
        for label, p in results[g.name].items():
            print(f"{g.name:<26}{label:<15}{len(p.gateway_ms):>6}{p.errors:>4}{p.cpu_per_call():>12.2f}"
                  f"{p.added(0.5):>13.2f}{p.added(0.99):>13.2f}{percentile(p.direct_ms, 0.5):>11.2f}"
                  f"{len(p.direct_ms):>13}")
            calls = max(1, len(p.gateway_ms))
            print("    by thread, ms/call: " + ", ".join(
                f"{name} {ms / calls:.2f}" for name, ms in p.by_thread.most_common(5) if ms / calls >= 0.01))
            if broker and g.kind == "sflow":
                print(f"{'  + its Kafka broker':<26}{label:<15}{'':>10}{p.broker_cpu_ms / calls:>12.2f}"
                      f"   (proxy + broker {(p.cpu_ms + p.broker_cpu_ms) / calls:.2f})")
    print(f"\n{'gateway':<26}{'RSS MiB start -> end':>22}  recorded / served, read back")
    for g in gateways:
        print(f"{g.name:<26}{g.rss_start_mb:>10.1f} -> {g.proc.memory_info().rss / 2**20:<8.1f}  {records[g.name]}")
    print("\nwhat each records (from its code) and how it runs here:")
    for g in gateways:
        print(f"- {g.name} [{g.version}]\n    records: {g.records}\n    runs: {g.settings}")
    ratios = {}
    for label in list(results[gateways[0].name]):
        ours = [results[g.name][label] for g in gateways if g.kind == "sflow"]
        peers = {g.name: results[g.name][label].cpu_per_call() for g in gateways if g.kind != "sflow"}
        if ours and peers:
            best = min(peers, key=lambda name: peers[name])
            ratios[label] = peers[best] / max(1e-9, ours[0].cpu_per_call())
            with_broker = (ours[0].cpu_ms + ours[0].broker_cpu_ms) / max(1, len(ours[0].gateway_ms))
            print(f"{label}: best peer {best} {peers[best]:.2f} ms/call, SeamlessFlow proxy "
                  f"{ours[0].cpu_per_call():.2f} ms/call" + (
                      f" (with its broker {with_broker:.2f}: best peer / proxy + broker "
                      f"{peers[best] / max(1e-9, with_broker):.2f}x)" if broker else ""))
    labels = list(ratios)
    if len(labels) == 2:
        print(f"{labels[0]} phase, CPU per call best peer / SeamlessFlow: {ratios[labels[0]]:.2f}x")
    return ratios[labels[-1]] if labels else float("nan")


async def run(args: argparse.Namespace, gateways: list[Gateway], codec: ChatCodec, script: Script, model: str,
              upstream: str, bus: BusConfig | None, broker: psutil.Process | None) -> float:
    limits = httpx.Limits(max_connections=args.sessions + 16, max_keepalive_connections=args.sessions + 16)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as http:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine)", flush=True)
        results, records = {}, {}
        for g in gateways:
            results[g.name] = await measure(g, args, http, codec, model, upstream,
                                            broker if g.kind == "sflow" else None)
            records[g.name] = await recorded(g, http, script, bus if g.kind == "sflow" else None)
            print(f"measured {g.name}", flush=True)
        return print_results(gateways, results, records, broker is not None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions of the concurrent phase")
    parser.add_argument("--rounds", type=int, default=2, help="concurrent rounds per gateway (each with a direct one)")
    parser.add_argument("--sequential", type=int, default=25, help="sessions of the back-to-back phase")
    parser.add_argument("--tool-turns", type=int, default=3, help="tool calls per session before its answer")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the fake upstream's fixed latency")
    parser.add_argument("--think-ms", type=float, default=2000.0,
                        help="tool time between the concurrent phase's calls, uniform in [0, think-ms]: it keeps a "
                             "2-core machine below saturation (else queueing in the shared upstream dominates)")
    parser.add_argument("--rllm-sync", action="store_true", help="also rllm-model-gateway with sync_traces: true")
    parser.add_argument("--peer-python", default="", help="a Python >= 3.12 for Agent Lightning's venv")
    parser.add_argument("--only", default="sflow,rllm,agl", help="gateways to run, of sflow, rllm, agl")
    args = parser.parse_args(argv)
    args.only = set(args.only.split(","))
    if not args.only <= {"sflow", "rllm", "agl"}:
        parser.error(f"--only={','.join(sorted(args.only))}: choose among sflow, rllm, agl")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    stop_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="vs-gateways-"))
    started = Started()
    try:
        model = create_default_model(work / "model")
        codec = ChatCodec.from_model_dir(model)
        script = Script(codec, args.tool_turns)
        port = free_port()
        started.procs.append(start(["bench/fake_upstream.py", "--port", str(port), "--model-path", str(model),
                                    "--latency-ms", str(args.latency_ms), "--tool-turns", str(args.tool_turns)],
                                   {"OMP_NUM_THREADS": "1"}, work / "upstream.log"))
        upstream = f"http://127.0.0.1:{port}"
        wait_http(f"{upstream}/health", started.procs[0], work / "upstream.log")
        gateways, bus = start_gateways(args, work, model, upstream, started)
        broker = None
        if started.cluster is not None and (pid := started.cluster.nodes[0].pid()) is not None:
            broker = psutil.Process(pid)
        print(f"upstream: bench/fake_upstream.py, {args.latency_ms:.0f} ms fixed latency; sessions of "
              f"{args.tool_turns} tool calls + the answer; max_tokens {MAX_TOKENS}, temperature 0; model {model.name} "
              f"(the default model's tokenizer and chat template)")
        ratio = asyncio.run(run(args, gateways, codec, script, model.name, upstream, bus, broker))
        print(f"ratio CPU per call, best peer / SeamlessFlow: {ratio:.2f}x")
    finally:
        started.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
