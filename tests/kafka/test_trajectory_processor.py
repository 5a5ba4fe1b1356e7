"""The trajectory processor (Faust worker, run as a subprocess) against a real broker.

Sessions are built from the event dataclasses (the capture proxy is not needed); every test checks
the processor's output against the functional core (`PrefixTree`) or against a replay.

Inputs are produced as the services produce them (`bus.producer`, lz4-compressed batches, which
Faust's Kafka client reads through cramjam).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import shutil
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents_adapter.errors import ConfigError
from agents_adapter.processor.config import ProcessorConfig
from agents_adapter.processor.prefix_tree import PrefixTree
from agents_adapter.processor.replay import ReplayReport, first_difference, replay_trajectories
from agents_adapter.processor.session_records import SessionDelta, trajectory_event_id
from agents_adapter.processor.table_codec import CLOSED, DELTA, TableKey
from agents_adapter.processor.tree_delta import AddCall
from bus.admin import ensure_topics
from bus.config import BusConfig
from bus.consumer import EventConsumer, Received, consumer_settings, fetch_ready, group_start_offsets, unique_group
from bus.dedupe import Deduplicator
from bus.errors import ConsumeError
from bus.faust_liveness import EXIT_BROKER_LOST
from bus.producer import EventProducer
from bus.replay import ReplayRange, replay
from infra.kafka.cluster import KafkaCluster, free_base_port
from schemas.events import (
    BatchReady,
    DeadLetter,
    Event,
    Heartbeat,
    LLMCall,
    SessionEnded,
    SessionStarted,
    TaskDispatched,
    Trajectory,
    encode_event,
    now_ms,
)
from schemas.prompt_refs import reference_form
from tests.service_process import ServiceProcess

REPO = Path(__file__).resolve().parents[2]
APP = "trajectory-processor"


# --- helpers -----------------------------------------------------------------------------------


class Worker(ServiceProcess):
    """`python -m agents_adapter.processor` with short timers for tests."""

    def __init__(self, config: BusConfig, data_dir: Path, log: Path, **options: object) -> None:
        self.config, self.data_dir = config, data_dir
        super().__init__("agents_adapter.processor", config, log, {
            "data-dir": data_dir, "tick-interval-s": 0.3, "session-timeout-s": 6, "commit-interval-s": 0.5,
            "stall-timeout-s": 5, "log-level": "info", **options})

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until this start logged that recovery is over and the streams run."""
        self.wait_for_log("Worker ready", timeout_s)

    def recovered_open_sessions(self) -> int:
        found = re.findall(r"recovered (\d+) open sessions", self.this_start_log())
        assert found, f"no recovery line in this start's log:\n{self.tail()}"
        return int(found[-1])


@pytest.fixture
def worker_factory(bus_config: BusConfig, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def make(**options: object) -> Worker:
        w = Worker(bus_config, tmp_path / f"data{len(workers)}", tmp_path / f"worker{len(workers)}.log", **options)
        workers.append(w)
        return w

    yield make
    for w in workers:
        w.stop()
    # no input was retried, dead-lettered for an unexpected error or as late, or restored with a gap
    unwanted = r"failed \(attempt|restored from|stopping the worker|PartitionsMismatch|arrived after session"
    for w in workers:
        assert not re.search(unwanted, w.log.read_text(errors="replace")), w.tail()


def producer(config: BusConfig) -> EventProducer:
    return EventProducer(config)


def session(sid: str, group: str, turns: int, *, n_samples: int | None = None, end: bool = True,
            reward: float = 1.0, task: str = "task-1") -> list[Event]:
    """SessionStarted, `turns` multi-turn calls (each prompt = the previous prompt + output + new
    tokens), SessionEnded."""
    seed = sum(map(ord, sid))
    meta = {"n_samples": str(n_samples)} if n_samples else {}
    events: list[Event] = [SessionStarted(correlation_id=sid, session_id=sid, agent_id="agent", task_id=task,
                                          group_id=group, metadata=meta)]
    history = [1, 2, 3, seed % 50]
    for turn in range(turns):
        output = [100 + (seed + turn) % 50, 200 + turn, 300 + seed % 7]
        tokens: dict[str, Any] = {"prompt_ids": tuple(history), "output_ids": tuple(output),
                                  "output_logprobs": (-0.5, -0.25, -1.0), "output_versions": (turn % 3,) * 3}
        events.append(LLMCall(correlation_id=sid, call_id=f"{sid}-c{turn}", session_id=sid, agent_id="agent",
                              task_id=task, group_id=group, model="toy", turn=turn, finish_reason="stop",
                              request_ms=0, completed_ms=1, **tokens))
        history = history + output + [7, 8 + turn]
    if end:
        events.append(SessionEnded(correlation_id=sid, session_id=sid, agent_id="agent", task_id=task,
                                   group_id=group, reward=reward, num_calls=turns))
    return events


def core_tree(events: list[Event]) -> PrefixTree:
    tree = PrefixTree()
    for e in events:
        if isinstance(e, LLMCall):
            tree.insert(e)
    return tree


def publish_all(config: BusConfig, events: list[Event]) -> None:
    with producer(config) as p:
        for e in events:
            p.publish(e)


def read_events(config: BusConfig, topic: str) -> list[Received]:
    """A topic's events (bus.replay), retried while a partition reports no leader: right after
    topics are created the broker can answer NOT_LEADER_FOR_PARTITION for a moment."""
    for attempt in range(20):
        try:
            return replay(config, [topic]).events
        except ConsumeError as e:
            if "NOT_LEADER" not in str(e) or attempt == 19:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def trajectories_on_topic(config: BusConfig) -> list[tuple[Trajectory, Received]]:
    """Every Trajectory copy on the topic, with where it was read."""
    return [(r.event, r) for r in read_events(config, "trajectories") if isinstance(r.event, Trajectory)]


def diagnose_missing(config: BusConfig, missing: set[str]) -> str:
    """Where each missing session's inputs are, what the changelog holds for it, and where the group resumes."""
    lines: list[str] = []
    for topic in ("llm.calls", "sessions"):
        for r in read_events(config, topic):
            sid = getattr(r.event, "session_id", "")
            if sid in missing:
                lines.append(f"input {topic}[{r.partition}]@{r.offset}: {type(r.event).__name__} {sid}"
                             f" {getattr(r.event, 'call_id', '')}")
    changelog = config.topic(f"{APP}-sessions-changelog")
    for i, (p, key, value) in enumerate(read_raw(config, changelog)):
        k = TableKey.from_bytes(key)
        if k.entity in missing:
            lines.append(f"changelog #{i} [{p}] kind={k.kind!r} part={k.partition} seq={k.seq} "
                         f"{'DELETE' if value is None else len(value)}")
    group = config.topic(APP)
    tps = [(config.topic(t), p) for t in ("llm.calls", "sessions") for p in range(4)]
    lines.append(f"group {group} resumes at {group_start_offsets(config, group, tps)}")
    return "\n".join(lines)


def wait_for_trajectories(config: BusConfig, ids: set[str], worker: Worker,
                          timeout_s: float = 60.0) -> dict[str, Trajectory]:
    """The trajectories of `ids` once all are on the topic (copies of one id asserted identical)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got: dict[str, Trajectory] = {}
        for t, _ in trajectories_on_topic(config):
            assert got.setdefault(t.trajectory_id, t) == t, f"two different trajectories for {t.trajectory_id}"
        if ids <= set(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"trajectories missing after {timeout_s}s: {sorted(ids - set(got))}\n{worker.tail()}")
        time.sleep(0.3)


def read_raw(config: BusConfig, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """(partition, key, value) of every record of a non-event topic (a changelog), in log order;
    empty while the topic (created by the worker) has no leader yet: callers poll."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer(consumer_settings(config, unique_group("raw"), **{"enable.partition.eof": False}))
    out: list[tuple[int, bytes, bytes | None]] = []
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        if meta.error is not None or any(p.leader < 0 for p in meta.partitions.values()):
            return []
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            position = low
            while position < high:
                for msg in fetch_ready(consumer, 500, 10):
                    if msg.error() is None:
                        out.append((p, msg.key() or b"", msg.value()))
                        position = (msg.offset() or 0) + 1
            consumer.unassign()
    except KafkaException as e:  # a leader moving while the topic is created
        if e.args[0].code() != KafkaError.NOT_LEADER_FOR_PARTITION:
            raise
        return []
    finally:
        consumer.close()
    return out


# --- tests that need no broker ----------------------------------------------------------------


@pytest.mark.unit
def test_config_is_validated_with_the_field_and_value_in_the_error() -> None:
    with pytest.raises(ConfigError, match=r"ttl_ms.*-5"):
        ProcessorConfig(ttl_ms=-5)
    with pytest.raises(ConfigError, match=r"session_timeout_s.*2"):
        ProcessorConfig(session_timeout_s=2)
    with pytest.raises(ConfigError, match=r"processing_guarantee.*'exactly_once'"):
        ProcessorConfig(processing_guarantee="exactly_once")  # see agents_adapter.processor.faust_shell
    with pytest.raises(ConfigError, match="group_size"):
        ProcessorConfig(group_size=0)
    config = ProcessorConfig.from_args(["--ttl-ms", "1500", "--group-size", "4", "--no-wait-for-calls"])
    assert (config.ttl_ms, config.group_size, config.wait_for_calls) == (1500, 4, False)
    assert config.assembler_config().track_groups is False


@pytest.mark.unit
def test_table_keys_round_trip_and_sort_deltas_by_seq() -> None:
    keys = [TableKey(DELTA, 3, "sé/ssion", seq) for seq in (0, 1, 2, 255, 256, 70_000)]
    assert [TableKey.from_bytes(k.to_bytes()) for k in keys] == keys
    assert sorted(k.to_bytes() for k in reversed(keys)) == [k.to_bytes() for k in keys]
    assert TableKey.from_bytes(TableKey(CLOSED, 0, "s").to_bytes()) == TableKey(CLOSED, 0, "s")


@pytest.mark.unit
def test_deduplicator_passes_each_event_id_once_within_its_bounds() -> None:
    clock = [0.0]
    dedupe = Deduplicator(capacity=3, ttl_s=10, clock=lambda: clock[0])
    a, b = (Trajectory(event_id=trajectory_event_id(s), trajectory_id=s, session_id=s, agent_id="x", reward=0.0,
                       status="completed", min_version=-1, max_version=-1, tokens_in_calls=0, tokens_in_tree=0)
            for s in ("a", "b"))
    assert [dedupe.first_time(e) for e in (a, b, a, b)] == [True, True, False, False]
    assert dedupe.duplicates == 2
    clock[0] = 11.0  # forgotten after ttl_s
    assert dedupe.first_time(a)


@pytest.mark.unit
def test_first_difference_names_the_node_and_field() -> None:
    events = session("s", "g", turns=3)
    tree = core_tree(events)
    t = Trajectory(trajectory_id="s", session_id="s", agent_id="agent", reward=1.0, status="completed",
                   nodes=tree.nodes(), call_ids=tree.call_ids, min_version=0, max_version=2,
                   tokens_in_calls=tree.tokens_in_calls, tokens_in_tree=tree.tokens_in_tree)
    node = tree.nodes()[1]
    changed = dataclasses.replace(node, logprobs=(-9.0, *tuple(node.logprobs)[1:]))  # type: ignore[arg-type]
    other = dataclasses.replace(t, nodes=(t.nodes[0], changed, *t.nodes[2:]))
    assert first_difference(t, t) is None
    assert first_difference(t, other) == ("nodes[1].logprobs", repr(list(node.logprobs)),
                                          repr(list(changed.logprobs)))
    assert first_difference(t, dataclasses.replace(t, nodes=t.nodes[:2]))[0] == "nodes"  # type: ignore[index]


# --- the processor on a broker ----------------------------------------------------------------


@pytest.mark.kafka
def test_each_session_becomes_one_trajectory_with_the_cores_nodes_and_groups_fire(
    bus_config: BusConfig, worker_factory: Callable[..., Worker]
) -> None:
    g1 = {f"g1-s{i}": session(f"g1-s{i}", "g1", turns=2 + i % 3, n_samples=4, reward=0.25 * i) for i in range(4)}
    g2 = {f"g2-s{i}": session(f"g2-s{i}", "g2", turns=3, task="task-2") for i in range(2)}
    sizes = [TaskDispatched(task_id="task-2", group_id="g2", n_samples=2, payload="", policy_version=0, seq=0)]
    worker = worker_factory().start()
    publish_all(bus_config, [*sizes, *(e for s in (*g1.values(), *g2.values()) for e in s)])
    by_id = wait_for_trajectories(bus_config, set(g1) | set(g2), worker)
    assert all(r.key == t.group_id for t, r in trajectories_on_topic(bus_config))  # keyed by task group
    for sid, events in {**g1, **g2}.items():
        t = by_id[sid]
        tree = core_tree(events)
        ended = events[-1]
        assert isinstance(ended, SessionEnded)
        assert t.nodes == tree.nodes()
        assert t.call_ids == tree.call_ids
        assert (t.status, t.reward, t.producer) == ("completed", ended.reward, APP)
        assert (t.min_version, t.max_version) == (tree.min_version, tree.max_version)
        assert t.event_id == trajectory_event_id(sid)
        assert t.ts_ms == max(e.ts_ms for e in events)

    deadline = time.monotonic() + 30
    while True:
        batches = {r.event.group_id: r.event for r in read_events(bus_config, "trajectories")
                   if isinstance(r.event, BatchReady)}
        if set(batches) == {"g1", "g2"} or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert set(batches) == {"g1", "g2"}, worker.tail()
    assert batches["g1"].trajectory_ids == tuple(sorted(g1)) and batches["g1"].num_samples == 4
    assert batches["g2"].trajectory_ids == tuple(sorted(g2)) and batches["g2"].task_id == "task-2"
    assert (batches["g1"].min_version, batches["g1"].max_version) == (0, 2)


@pytest.mark.kafka
def test_poison_messages_go_to_the_dlq_and_processing_continues(
    bus_config: BusConfig, worker_factory: Callable[..., Worker]
) -> None:
    before, after = session("before", "g", turns=2), session("after", "g", turns=2)
    good = after[1]
    assert isinstance(good, LLMCall)
    # same key as "after", before its calls: the session is open when the bad call is read
    malformed = LLMCall(**{**{f: getattr(good, f) for f in good.__dataclass_fields__},
                           "event_id": "bad-call", "call_id": "after-bad", "output_logprobs": (-0.5,)})
    heartbeat = Heartbeat(correlation_id="before", resource_id="r0", activity="idle", weight_version=0,
                          running_requests=0, queued_requests=0, tokens_generated=0)
    with producer(bus_config) as p:
        for e in before[:-1]:
            p.publish(e)
        p.publish_raw(bus_config.topic("llm.calls"), b"before", b"\xc3\x01not avro at all")
        p.publish_raw(bus_config.topic("sessions"), b"before", encode_event(heartbeat))
        p.publish(before[-1])
        p.publish(after[0])
        p.publish(malformed)
        for e in after[1:]:
            p.publish(e)
    worker = worker_factory().start()
    got = wait_for_trajectories(bus_config, {"before", "after"}, worker)
    assert got["before"].nodes == core_tree(before).nodes()
    assert got["after"].nodes == core_tree(after).nodes() and "after-bad" not in got["after"].call_ids

    deadline = time.monotonic() + 20
    while len(letters := [r.event for r in read_events(bus_config, "dlq")]) < 3 and time.monotonic() < deadline:
        time.sleep(0.3)
    reasons = sorted(letter.reason for letter in letters if isinstance(letter, DeadLetter))
    assert len(reasons) == 3, reasons
    assert reasons[0].startswith("rejected call: call 'after-bad': 3 output tokens but 1 logprobs")
    assert reasons[1].startswith("undecodable")
    assert reasons[2] == f"unexpected Heartbeat on {bus_config.topic('sessions')}"


@pytest.mark.kafka
def test_a_session_that_never_ends_is_closed_by_the_ttl_with_status_timeout(
    bus_config: BusConfig, worker_factory: Callable[..., Worker]
) -> None:
    ttl = 1500
    never, ends = session("never", "g", turns=3, end=False), session("ends", "g", turns=1)
    worker = worker_factory(**{"ttl-ms": ttl}).start()
    publish_all(bus_config, never + ends)
    by_id = wait_for_trajectories(bus_config, {"never", "ends"}, worker, timeout_s=30)
    timed_out, completed = by_id["never"], by_id["ends"]
    assert (timed_out.status, timed_out.reward) == ("timeout", 0.0)
    assert timed_out.ts_ms == max(e.ts_ms for e in never) + ttl  # derived from the inputs, not the clock
    assert timed_out.nodes == core_tree(never).nodes()
    assert completed.status == "completed"


@pytest.mark.kafka
def test_changelog_writes_grow_with_the_new_tokens_not_the_tree_and_closed_sessions_are_freed(
    bus_config: BusConfig, worker_factory: Callable[..., Worker]
) -> None:
    turns = 20
    events = session("long", "g", turns=turns, end=False)
    worker = worker_factory().start()
    publish_all(bus_config, events)
    changelog = bus_config.topic(f"{APP}-sessions-changelog")
    deadline = time.monotonic() + 30
    while len(entries := read_raw(bus_config, changelog)) < turns + 1 and time.monotonic() < deadline:
        time.sleep(0.3)
    writes = [(TableKey.from_bytes(k), v) for _, k, v in entries]
    assert [k.seq for k, _ in writes] == list(range(turns + 1)) and all(k.kind == DELTA for k, _ in writes)
    call_writes = {}  # call id -> (its delta, bytes written); SessionStarted wrote a header-only delta
    for key, value in writes:
        assert value is not None
        delta = SessionDelta.from_bytes(value)
        for op in delta.tree.ops:
            if isinstance(op, AddCall):
                call_writes[op.call_id] = (delta, len(key.to_bytes()) + len(value))
    print("\ncall  new tokens  tokens in tree  tokens in calls  whole tree bytes  changelog bytes (key+value)")
    tree = PrefixTree()
    sizes = []
    for call in events[1:]:
        assert isinstance(call, LLMCall)
        delta, size = call_writes[call.call_id]
        tree.insert(call)
        sizes.append(size)
        whole = len(tree.snapshot().to_bytes())
        print(f"{call.turn:>4}  {delta.tree.new_tokens:>10}  {tree.tokens_in_tree:>14}  {tree.tokens_in_calls:>15}"
              f"  {whole:>16}  {size:>15}")
        assert delta.tree.new_tokens == (7 if call.turn == 0 else 5)  # turn k > 0: 2 new prompt + 3 output tokens
    steady = sizes[1:]
    assert max(steady) - min(steady) <= 1  # constant (± a digit of the call id) while the tree grows
    assert len(tree.snapshot().to_bytes()) > 8 * max(steady)

    publish_all(bus_config, [SessionEnded(correlation_id="long", session_id="long", agent_id="agent",
                                          reward=1.0, num_calls=turns)])
    wait_for_trajectories(bus_config, {"long"}, worker)
    deadline = time.monotonic() + 20
    while True:
        last = {k: v for _, k, v in read_raw(bus_config, changelog)}
        live = {TableKey.from_bytes(k) for k, v in last.items() if v is not None}
        if all(k.kind == CLOSED for k in live) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert {(k.kind, k.entity) for k in live} == {(CLOSED, "long")}  # every delta deleted, one marker left


@pytest.mark.kafka
def test_sigkilled_workers_lose_no_session_and_dedupe_leaves_each_trajectory_once(
    bus_config: BusConfig, worker_factory: Callable[..., Worker]
) -> None:
    """Sessions stream in while the worker is SIGKILLed twice: restarted once with its data dir (which
    it drops: recovery from the changelog), once with the data dir deleted. A consumer that drops
    repeated event ids sees every session's trajectory exactly once, with the core's nodes."""
    n = 40
    sessions = {f"s{i:02d}": session(f"s{i:02d}", f"g{i // 4}", turns=3 + i % 3, n_samples=4) for i in range(n)}
    # interleave: session i starts at round i % 8; all are open for most of the stream
    stream: list[Event] = []
    for k in range(max(map(len, sessions.values())) + 8):
        for i, events in enumerate(sessions.values()):
            if 0 <= k - i % 8 < len(events):
                stream.append(events[k - i % 8])
    assert len(stream) == sum(map(len, sessions.values()))
    worker = worker_factory(**{"commit-interval-s": 1.0}).start()
    worker.wait_ready()
    progress = [0]
    restarted = threading.Event()

    def produce() -> None:
        """Publishes the stream; waits at 70% until the first restart, so the second kill is mid-stream."""
        with producer(bus_config) as p:
            for i, e in enumerate(stream):
                if i == int(0.7 * len(stream)):
                    restarted.wait(90)
                if i % 10 == 0:
                    p.publish_sync(e)
                else:
                    p.publish(e)
                progress[0] = i
                time.sleep(0.02)

    feeder = threading.Thread(target=produce)
    feeder.start()
    consumer = EventConsumer(bus_config, "trainer", ["trajectories"])
    dedupe = Deduplicator()
    consumed: Counter[str] = Counter()
    copies: dict[str, set[bytes]] = defaultdict(set)

    def consume(until: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not until() and time.monotonic() < deadline:
            for r in consumer.poll(0.2):
                if isinstance(r.event, Trajectory):
                    copies[r.event.trajectory_id].add(r.raw)
                    if dedupe.first_time(r):
                        consumed[r.event.trajectory_id] += 1
                consumer.mark_processed(r)
            consumer.commit()

    try:
        consume(lambda: progress[0] > len(stream) // 3 and len(consumed) >= 3, 60)
        worker.kill()  # 1: restart on the local RocksDB data
        worker.start()
        worker.wait_ready()
        assert worker.recovered_open_sessions() > 0
        restarted.set()
        consume(lambda: progress[0] > 0.85 * len(stream), 60)
        consume(lambda: False, 0.5)
        worker.kill()  # 2: restart without it: recovery from the changelog alone
        shutil.rmtree(worker.data_dir)
        worker.start()
        worker.wait_ready()
        assert worker.recovered_open_sessions() > 0
        feeder.join()
        consume(lambda: len(consumed) == n, 90)
    finally:
        restarted.set()
        feeder.join()
        consumer.close()
    missing = set(sessions) - set(consumed)
    on_topic = {t.trajectory_id for t, _ in trajectories_on_topic(bus_config)} if missing else set()
    assert not missing, (f"not consumed: {sorted(missing)}; of these on the topic: {sorted(missing & on_topic)}"
                         f"\n{diagnose_missing(bus_config, missing)}\n{worker.tail()}")
    assert all(count == 1 for count in consumed.values())
    assert all(len(raw) == 1 for raw in copies.values())  # redelivered copies are byte-identical
    by_id = {t.trajectory_id: t for t, _ in trajectories_on_topic(bus_config)}
    for sid, events in sessions.items():
        assert by_id[sid].nodes == core_tree(events).nodes(), sid
        assert by_id[sid].status == "completed"
    # the group stage survived the kills too: one BatchReady (after dedupe) per group of 4
    groups = {f"g{i}": sorted(sid for sid in sessions if int(sid[1:]) // 4 == i) for i in range(n // 4)}
    deadline = time.monotonic() + 30
    while True:
        batches = [r.event for r in read_events(bus_config, "trajectories") if isinstance(r.event, BatchReady)]
        firsts = {b.group_id: b for b in Deduplicator().filter(batches)}
        if set(firsts) == set(groups) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert {g: list(b.trajectory_ids) for g, b in firsts.items()} == groups
    print(f"\n{dedupe.duplicates} duplicate trajectory copies and {len(batches) - len(firsts)} duplicate"
          " BatchReady copies dropped by the consumer")


@pytest.mark.kafka
def test_open_sessions_are_recovered_from_the_changelog_when_the_data_dir_is_lost(
    bus_config: BusConfig, worker_factory: Callable[..., Worker]
) -> None:
    """Calls processed and committed before the kill exist only in the changelog afterwards: if the
    recovery did not restore them, the trajectories would miss their first calls."""
    sessions = {f"r{i}": session(f"r{i}", "g", turns=4) for i in range(6)}
    first = [e for events in sessions.values() for e in events[:3]]  # start + 2 calls each
    rest = [e for events in sessions.values() for e in events[3:]]
    worker = worker_factory().start()
    publish_all(bus_config, first)
    changelog = bus_config.topic(f"{APP}-sessions-changelog")
    deadline = time.monotonic() + 30
    while len(read_raw(bus_config, changelog)) < len(first) and time.monotonic() < deadline:
        time.sleep(0.3)
    time.sleep(1.5)  # three commit intervals: the inputs' offsets are committed
    worker.kill()
    shutil.rmtree(worker.data_dir)
    worker.start()
    worker.wait_ready()
    assert worker.recovered_open_sessions() == len(sessions)
    publish_all(bus_config, rest)
    by_id = wait_for_trajectories(bus_config, set(sessions), worker)
    for sid, events in sessions.items():
        assert by_id[sid].nodes == core_tree(events).nodes()
        assert by_id[sid].call_ids == tuple(f"{sid}-c{t}" for t in range(4))


@pytest.mark.kafka
def test_replay_rebuilds_the_recorded_trajectories_and_reports_tampering(
    bus_config: BusConfig, worker_factory: Callable[..., Worker]
) -> None:
    ttl = 1500
    sessions = {f"p{i}": session(f"p{i}", "g", turns=2 + i) for i in range(4)}
    sessions["idle"] = session("idle", "g", turns=2, end=False)
    worker = worker_factory(**{"ttl-ms": ttl}).start()
    inputs = [e for events in sessions.values() for e in events]
    publish_all(bus_config, inputs)
    recorded = wait_for_trajectories(bus_config, set(sessions), worker)
    worker.stop()
    config = ProcessorConfig(bus=bus_config, ttl_ms=ttl, tick_interval_s=0.3)

    report = replay_trajectories(config, ReplayRange(), grace_ms=0)
    assert report.ok, report.render()
    assert report.matched == sorted(sessions) and report.inputs == len(inputs)
    t0, t1 = min(e.ts_ms for e in inputs) - 1000, now_ms()
    assert replay_trajectories(config, ReplayRange(start_ms=t0, end_ms=t1), grace_ms=0).ok

    tampered = dataclasses.replace(recorded["p2"], reward=0.5)
    forged = dataclasses.replace(recorded["p0"], trajectory_id="forged", session_id="forged",
                                 event_id=trajectory_event_id("forged"))
    unrecorded = session("unrecorded", "g", turns=2)
    with producer(bus_config) as p:
        p.publish(tampered)
        p.publish(forged)
        for e in unrecorded:
            p.publish(e)
    report = replay_trajectories(config, ReplayRange(), grace_ms=0)
    assert isinstance(report, ReplayReport) and not report.ok
    assert report.missing == ["unrecorded"] and report.extra == ["forged"]
    assert [(d.trajectory_id, d.field, d.rebuilt, d.recorded) for d in report.differing] == [
        ("p2", "reward", "1.0", "0.5")]
    assert report.matched == sorted(set(sessions) - {"p2"})
    text = report.render()
    assert "MISMATCH" in text and "p2: reward: rebuilt 1.0, recorded 0.5" in text
    assert report.duplicates == 0  # the tampered copy is a difference, not a redelivery
    print("\n" + text)


def rewriting_session(sid: str, turns: int, rewrite_every: int) -> list[Event]:
    """A long session whose agent rewrites its history every `rewrite_every` turns (it keeps the first
    prompt and the last two turns, as a context-compressing agent does): one fork per rewrite."""
    rng = random.Random(sid)
    events: list[Event] = [SessionStarted(correlation_id=sid, session_id=sid, agent_id="agent", group_id="rw")]
    first = [rng.randrange(1000) for _ in range(64)]
    history, turn_spans = list(first), []
    for turn in range(turns):
        if turn and turn % rewrite_every == 0:
            history = first + [999] + [t for span in turn_spans[-2:] for t in span]
        output = [rng.randrange(1000) for _ in range(8)]
        events.append(LLMCall(correlation_id=sid, call_id=f"{sid}-c{turn}", session_id=sid, agent_id="agent",
                              group_id="rw", model="toy", turn=turn, finish_reason="stop", request_ms=0,
                              completed_ms=1, prompt_ids=tuple(history), output_ids=tuple(output),
                              output_logprobs=(-0.5,) * 8, output_versions=(turn % 3,) * 8))
        tool = [rng.randrange(1000) for _ in range(rng.randrange(20, 200))]
        turn_spans.append(output + tool)
        history = history + output + tool
    events.append(SessionEnded(correlation_id=sid, session_id=sid, agent_id="agent", group_id="rw", reward=1.0,
                               num_calls=turns))
    return events


def by_reference(events: list[Event]) -> list[Event]:
    """The session as the proxy records it: each call by reference to the earlier one it extends or forks."""
    calls = [e for e in events if isinstance(e, LLMCall)]
    return [reference_form(e, calls[:calls.index(e)]) if isinstance(e, LLMCall) else e for e in events]


@pytest.mark.kafka
def test_long_rewriting_sessions_recorded_by_reference_replay_byte_identical(
    bus_config: BusConfig, worker_factory: Callable[..., Worker]
) -> None:
    """Sessions of 60 calls rewriting their history every 10 turns, recorded by reference: the worker's
    trajectories are those of the calls in full (one branch per rewrite), and `replay_trajectories` rebuilds
    them byte for byte; a reference to a call that was never recorded is dead-lettered with its reason."""
    sessions = {f"rw{i}": rewriting_session(f"rw{i}", 60, 10) for i in range(3)}
    recorded = {sid: by_reference(events) for sid, events in sessions.items()}
    calls = [e for events in recorded.values() for e in events if isinstance(e, LLMCall)]
    assert sum(e.by_reference for e in calls) == len(calls) - 3  # only each session's first call is in full
    assert sum(len(e.prompt_ids) for e in calls) < sum(e.prompt_len for e in calls) / 5
    worker = worker_factory().start()
    publish_all(bus_config, [e for events in recorded.values() for e in events])
    by_id = wait_for_trajectories(bus_config, set(sessions), worker)
    for sid, events in sessions.items():
        tree = core_tree(events)
        assert by_id[sid].nodes == tree.nodes() and len(tree.paths()) == 6  # one branch per rewrite
    orphan = dataclasses.replace(calls[5], call_id="orphan", session_id="lost", correlation_id="lost")
    publish_all(bus_config, [orphan])
    deadline = time.monotonic() + 20
    while not (letters := [r.event for r in read_events(bus_config, "dlq")]) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert [letter.reason for letter in letters if isinstance(letter, DeadLetter)] == [
        "rejected call: call 'orphan' refers to call 'rw0-c4', which session 'lost' does not hold"]
    worker.stop()
    report = replay_trajectories(ProcessorConfig(bus=bus_config), ReplayRange(), grace_ms=0)
    assert report.matched == sorted(sessions), report.render()


KILL_SEED = int(os.environ.get("SFLOW_KILL_SEED", "0")) or random.SystemRandom().randrange(1, 10**6)


@pytest.mark.kafka
@pytest.mark.parametrize("trial", [0, 1])
def test_200_sessions_with_a_sigkill_at_a_random_point_lose_nothing(
    bus_config: BusConfig, worker_factory: Callable[..., Worker], trial: int
) -> None:
    """200 interleaved sessions; the worker is SIGKILLed once at a random point of the stream and
    restarted (with or without its data dir). Every session ends as one trajectory with all its
    calls, and no call is dead-lettered as late (the fixture checks the worker log for it). The seed
    is printed; SFLOW_KILL_SEED=N reruns a draw."""
    rng = random.Random(KILL_SEED * 10 + trial)
    n = 200
    sessions = {f"k{i:03d}": session(f"k{i:03d}", f"kg{i // 4}", turns=1 + rng.randrange(5), n_samples=4)
                for i in range(n)}
    stream = _interleaved(list(sessions.values()), rounds_apart=rng.randrange(1, 40))
    kill_at, keep_data = rng.randrange(len(stream) // 10, len(stream)), rng.random() < 0.5
    print(f"\nseed {KILL_SEED}, trial {trial}: SIGKILL after {kill_at} of {len(stream)} inputs,"
          f" {'with' if keep_data else 'without'} the data dir")
    worker = worker_factory().start()
    worker.wait_ready()
    with producer(bus_config) as p:
        for i, e in enumerate(stream):
            if i == kill_at:
                p.flush()
                worker.kill()
                if not keep_data:
                    shutil.rmtree(worker.data_dir, ignore_errors=True)
                worker.start()
            p.publish(e)
            if i % 50 == 0:
                p.flush()
    by_id = wait_for_trajectories(bus_config, set(sessions), worker, timeout_s=120)
    assert sorted(by_id) == sorted(sessions)
    for sid, events in sessions.items():
        assert by_id[sid].nodes == core_tree(events).nodes(), sid
        assert by_id[sid].call_ids == tuple(e.call_id for e in events if isinstance(e, LLMCall)), sid
    letters = [r.event for r in read_events(bus_config, "dlq") if isinstance(r.event, DeadLetter)]
    assert letters == [], [d.reason for d in letters]


@pytest.mark.kafka
def test_a_static_member_sigkilled_and_restarted_takes_its_partitions_back_at_once(
    bus_config: BusConfig, worker_factory: Callable[..., Worker]
) -> None:
    """With a group instance id the restarted worker replaces its dead self in the group at once. Its
    session timeout is Kafka's maximum (300 s), so a dynamic member's partitions stay with the dead one
    until Faust's rebalance timeout (60 s) gives up on it: measured here, a dynamic restart's first
    trajectory came 65 s after it, the static one's in 7 s. Within 45 s can only be the static rejoin."""
    worker = worker_factory(**{"session-timeout-s": 300, "group-instance-id": "processor-0"}).start()
    worker.wait_ready()
    before = session("before", "sg0", turns=2)
    publish_all(bus_config, before)
    wait_for_trajectories(bus_config, {"before"}, worker)
    worker.kill()
    worker.start()
    after = session("after", "sg1", turns=3)
    publish_all(bus_config, after)
    by_id = wait_for_trajectories(bus_config, {"before", "after"}, worker, timeout_s=45)
    assert by_id["after"].nodes == core_tree(after).nodes()


def _interleaved(sessions: list[list[Event]], rounds_apart: int) -> list[Event]:
    """Session i's k-th event goes out in round k + i % rounds_apart: many sessions open at once."""
    stream: list[Event] = []
    for k in range(max(map(len, sessions)) + rounds_apart):
        for i, events in enumerate(sessions):
            if 0 <= k - i % rounds_apart < len(events):
                stream.append(events[k - i % rounds_apart])
    return stream


@pytest.mark.kafka
def test_a_worker_whose_broker_is_gone_exits_with_status_3(tmp_path: Path) -> None:
    """A broker of its own (stopping the session broker would end the other tests): the worker runs on
    it, the broker stops, and the worker exits within its broker_lost_timeout_s instead of spinning."""
    cluster = KafkaCluster(tmp_path / "kafka", nodes=1, base_port=free_base_port())
    cluster.start()
    worker: Worker | None = None
    try:
        config = BusConfig(bootstrap_servers=cluster.bootstrap_servers, topic_prefix="lost.", client_id="pytest")
        ensure_topics(config)
        worker = Worker(config, tmp_path / "data", tmp_path / "worker.log", **{"broker-lost-timeout-s": 5})
        worker.start()
        worker.wait_ready()
        cluster.stop()
        assert worker.proc is not None
        deadline = time.monotonic() + 60
        while worker.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert worker.proc.poll() == EXIT_BROKER_LOST, worker.tail()
        assert "reachable for" in worker.this_start_log()
    finally:
        if worker is not None:
            worker.stop()
        cluster.stop(kill=True)
