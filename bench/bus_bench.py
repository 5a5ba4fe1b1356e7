"""Bus benchmark.

1. Encode+decode of one LLMCall (2,000 prompt + 500 output tokens): packed `bytes` token fields (what
   the project ships) vs the same record with `array<int>` / `array<float>` fields, in the same run
   (each the fastest of 5 rounds: the machine is shared).
2. Produce -> consume on a local broker started for the run: throughput (a consumer thread reads while
   the producer writes, as services consume while proxies produce): one warm-up pass, then `--rounds`
   timed passes of `--calls` events, their median printed; and p50/p99 latency of the same event
   (idempotent producer, acks=all, the producer's default batching and compression unless overridden).

Run: .venv/bin/python bench/bus_bench.py  [--calls N] [--rounds R] [--compression lz4|zstd|none] [--linger-ms MS]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bus.admin import ensure_topics
from bus.config import BusConfig
from bus.consumer import EventConsumer
from bus.producer import PRODUCER_DEFAULTS, EventProducer
from infra.kafka.cluster import KafkaCluster, free_base_port
from infra.launcher import stop_on_sigterm
from schemas.events import LLMCall, Segment, decode_event, encode_event
from schemas.packed import Float32s, Int32s
from schemas.registry import default_registry

PACKED_AS_ARRAY = {"prompt_ids": "int", "output_ids": "int", "output_versions": "int", "output_logprobs": "float"}


# The token payloads, packed once: what is measured is the event's encoding and the bus, not the Python
# lists -> Int32s conversion of the bench's own test data (200 µs a call, more than the whole bus path).
_PROMPT = Int32s([(7 * k) % 151_000 for k in range(2000)])
_OUTPUT = Int32s([(13 * k) % 151_000 for k in range(500)])
_LOGPROBS = Float32s([-0.001 * k for k in range(500)])
_VERSIONS = Int32s([3] * 500)


def make_call(i: int = 0) -> LLMCall:
    return LLMCall(
        call_id=f"c{i}",
        session_id=f"s{i % 64}",
        agent_id="bench",
        model="m",
        turn=i,
        prompt_ids=_PROMPT,
        output_ids=_OUTPUT,
        output_logprobs=_LOGPROBS,
        output_versions=_VERSIONS,
        finish_reason="stop",
        segments=(Segment(resource_id="r0", weight_version=3, start=0, num_tokens=500, finish_reason="stop",
                          started_ms=0, ended_ms=1),),
        request_ms=0,
        completed_ms=1,
    )


def array_schema() -> object:
    definition = json.loads(json.dumps(default_registry().current("LLMCall").definition))
    definition["name"] = "LLMCallArrays"
    for f in definition["fields"]:
        if f["name"] in PACKED_AS_ARRAY:
            f["type"] = {"type": "array", "items": PACKED_AS_ARRAY[f["name"]]}
    return fastavro.parse_schema(definition)


def best_of(run: Callable[[], object], iterations: int, repeats: int = 5) -> float:
    """Seconds per call of `run`: the fastest of `repeats` rounds of `iterations` calls (timeit's rule: on a
    shared machine the slower rounds measure the other processes, not the code)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iterations):
            run()
        best = min(best, (time.perf_counter() - t0) / iterations)
    return best


def bench_raw_packed(iterations: int) -> float:
    """fastavro alone on the packed record (dict in, dict out): the codec cost without the event classes."""
    current = default_registry().current("LLMCall").parsed
    record = make_call().to_avro()

    def run() -> None:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, current, record)
        fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), current, None)

    return best_of(run, iterations // 5)


def bench_codec(iterations: int) -> tuple[float, float, int, int]:
    call = make_call()
    # Checked once, before timing (which also builds the registry and the converters): the timed loops of both
    # encodings do the same thing, encode then decode, with no comparison of what came back.
    assert decode_event(encode_event(call)) == call

    def packed() -> None:
        decode_event(encode_event(call))

    schema: Any = array_schema()
    record = call.to_avro()
    for name in PACKED_AS_ARRAY:
        record[name] = list(getattr(call, name))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)

    def arrays() -> None:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, schema, record)
        fastavro.schemaless_reader(io.BytesIO(out.getvalue()), schema, None)

    read: Any = fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), schema, None)
    assert read["output_ids"] == record["output_ids"]

    packed_s, array_s = best_of(packed, iterations // 5), best_of(arrays, max(1, iterations // 50))
    return packed_s, array_s, len(encode_event(call)), len(buf.getvalue())


def _consume(consumer: EventConsumer, calls: int, done: list[float]) -> None:
    received = 0
    while received < calls:
        received += len(consumer.poll(1.0, max_messages=1000))
    done.append(time.perf_counter())


def _throughput(producer: EventProducer, consumer: EventConsumer, first: int, calls: int) -> float:
    """Calls/s of one pass: `calls` events as fast as the producer takes them, read by a consumer running at
    the same time (its own thread, as a service consumes while the proxies produce), from the first publish
    to the last event consumed."""
    done: list[float] = []
    # a daemon: a pass cut short (SIGTERM, Ctrl-C) must not keep the process waiting on events never produced
    reader = threading.Thread(target=_consume, args=(consumer, calls, done), daemon=True)
    t0 = time.perf_counter()
    reader.start()
    for i in range(first, first + calls):
        producer.publish(make_call(i))
    producer.flush()
    reader.join()
    return calls / (done[0] - t0)


def bench_broker(calls: int, rounds: int, producer_settings: dict[str, Any],
                 paced: int = 200) -> tuple[float, list[float], float, float]:
    """Throughput: one untimed warm-up pass, then `rounds` timed passes of `calls` events each (`_throughput`);
    the warm-up's rate and each round's are returned. The broker is started for the run with the JVM's client
    compiler, so its first second is spent compiling its request path: a one-pass figure measured that start,
    not the path a running proxy uses. Latency: `paced` events sent one at a time (10 ms apart), produce to
    consume, so queueing behind a burst does not count as latency."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = KafkaCluster(Path(tmp), nodes=1, base_port=free_base_port())
        cluster.start()
        try:
            config = BusConfig(bootstrap_servers=cluster.bootstrap_servers, topic_prefix="bench.")
            ensure_topics(config)
            consumer = EventConsumer(config, "bench", ["llm.calls"])
            while not consumer.assigned():
                consumer.poll(0.5)  # join the group before producing
            producer = EventProducer(config, **producer_settings)
            producer.publish(make_call(-1))  # the producer id and the partition leaders, before timing
            producer.flush()
            while not consumer.poll(1.0):
                pass
            warmup = _throughput(producer, consumer, 0, calls)
            rates = [_throughput(producer, consumer, (r + 1) * calls, calls) for r in range(rounds)]
            latencies: list[float] = []
            for i in range(paced):
                sent = time.perf_counter()
                producer.publish(make_call((rounds + 1) * calls + i))
                got: list[object] = []
                while not got:
                    got = list(consumer.poll(1.0))
                latencies.append((time.perf_counter() - sent) * 1000)
                time.sleep(0.01)
            producer.close()
            consumer.close()
        finally:
            cluster.stop()
    latencies.sort()
    return warmup, rates, statistics.median(latencies), latencies[int(0.99 * (len(latencies) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--calls", type=int, default=5000, help="events per throughput pass")
    parser.add_argument("--rounds", type=int, default=3, help="timed throughput passes after the warm-up pass")
    parser.add_argument("--compression", default=None, help="producer compression.type (default: EventProducer's)")
    parser.add_argument("--linger-ms", type=float, default=None, help="producer linger.ms (default: EventProducer's)")
    args = parser.parse_args()
    console = Console()
    stop_on_sigterm()  # `timeout`/`kill` stop the broker and the processes it started too
    packed_s, array_s, packed_bytes, array_bytes = bench_codec(args.iterations)
    raw_s = bench_raw_packed(args.iterations)
    table = Table(title="LLMCall 2,000 + 500 tokens: encode + decode")
    table.add_column("encoding")
    table.add_column("µs / call", justify="right")
    table.add_column("calls / s", justify="right")
    table.add_column("bytes", justify="right")
    table.add_row("packed bytes, full event path (shipped)", f"{packed_s * 1e6:.1f}", f"{1 / packed_s:,.0f}",
                  str(packed_bytes))
    table.add_row("packed bytes, fastavro dicts only", f"{raw_s * 1e6:.1f}", f"{1 / raw_s:,.0f}", str(packed_bytes))
    table.add_row("array<int> (baseline)", f"{array_s * 1e6:.1f}", f"{1 / array_s:,.0f}", str(array_bytes))
    console.print(table)
    overrides = {k: v for k, v in (("compression.type", args.compression), ("linger.ms", args.linger_ms))
                 if v is not None}
    settings = {**PRODUCER_DEFAULTS, **overrides}
    warmup, rates, p50, p99 = bench_broker(args.calls, args.rounds, overrides)
    rate = statistics.median(rates)
    shown = ", ".join(f"{k}={v}" for k, v in settings.items())
    t2 = Table(title=f"produce -> consume on a local broker ({args.calls} LLMCalls a pass, acks=all, {shown}; "
               "latency: 200 paced)")
    for col in ("calls / s (median)", "each timed pass", "warm-up pass", "MB / s", "p50 latency ms", "p99 latency ms"):
        t2.add_column(col, justify="right")
    t2.add_row(f"{rate:,.0f}", " ".join(f"{r:,.0f}" for r in rates), f"{warmup:,.0f}",
               f"{rate * packed_bytes / 1e6:.1f}", f"{p50:.1f}", f"{p99:.1f}")
    console.print(t2)
    print(f"ratio packed vs array<int>, fastavro dicts only: {array_s / raw_s:.1f}x")
    print(f"ratio packed vs array<int> encode+decode (full event path): {array_s / packed_s:.1f}x")


if __name__ == "__main__":
    main()
