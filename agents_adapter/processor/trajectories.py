"""The trajectory processor: the Faust shell around `TrajectoryAssembler` (docs/architecture.md).

Run it with `python -m agents_adapter.processor.trajectories [options]` (bus settings from SFLOW_BOOTSTRAP,
SFLOW_TOPIC_PREFIX, SFLOW_REPLICATION) or `worker(ProcessorConfig(...))`.

Topology (N = partitions of `llm.calls`, which must equal those of `sessions`)
    stage 1, keyed by session: one agent reads `llm.calls`, `sessions` and the processor's own
        `<app>-ticks` topic (all N partitions, so Faust co-partitions them: partition p of every
        topic goes to the same worker). Each partition has its own `TrajectoryAssembler`; the table
        `sessions` holds its open sessions. On a close it publishes the Trajectory to `trajectories`,
        then a small member record (group, trajectory id, versions, ts, group size) to `<app>-groups`.
    stage 2, keyed by group: one agent reads `<app>-groups` (N partitions, keyed by group id) and
        counts samples per group in a `GroupTracker` backed by the table `groups`; it publishes
        `BatchReady` to `trajectories` when a group has its n samples. A group's sessions live on
        different partitions of stage 1, hence the second, group-keyed stage. It also forwards the
        group sizes of `TaskDispatched` (topic `tasks`) into `<app>-groups`, so n comes from the task
        (`GroupTracker.expect`), else from SessionStarted metadata, else from `group_size`.
    TTL: a Faust timer sends a tick (a MetricSample) to partition p of `<app>-ticks` for each input
        partition p this worker owns; the stage-1 agent handles it like an input, so the timeouts
        run in an event of partition p and their table writes go to p's store and changelog
        (Faust tables can be changed only while processing an event of the key's partition).

Table `sessions` (RocksDB, changelog `<app>-sessions-changelog`): one immutable entry per delta
    key  b"d" | u16 partition | u16 len | session id | u32 seq   value  `SessionDelta.to_bytes()`
    key  b"c" | u16 partition | u16 len | session id             value  `CloseMarker.to_bytes()`: close ts
                                                                        and the digests of its call ids
    Each state change of a session is written once, as its own entry, never rewritten: an LLM call
    costs one entry of ~45 bytes of key and header + the session's ids + the tree delta (17 bytes,
    then 13 per new token, 9 per re-claimed token, 13 per split, 20 + id per call record), i.e.
    proportional to what the call added, never to the tree (measured in the kafka test: 188 bytes
    for each 5-token turn while the whole tree grows to 2.1 kB). A SessionStarted or a waiting
    SessionEnded costs a header-only entry. Closing a session writes the
    close marker, then deletes the entries (one changelog tombstone each, compacted away); the
    marker keeps re-read inputs of a closed session from re-opening it until `closed_retention_ms`
    has passed. Writes of one input reach the changelog in order, so a crash leaves a prefix of
    them, and every prefix is a state a recovery can use (deltas 0..k; a marker with leftovers).
    The partition in the key lets a recovery put each entry back into its partition's assembler
    with the public table API alone. Recovery replays the entries in key order (= seq order).
Table `groups`: b"g" | partition | group id -> JSON of a pending group (size, task, members; n is a
    handful of samples), b"f" | partition | group id -> fired marker (i64 ts).

Delivery guarantee: effectively once
    Faust is at least once: an input's offset is committed after it was processed, and its outputs
    (the Trajectory, awaited until Kafka acknowledged it, then the table entries, which Faust's
    producer flushes before it commits) are written before that. A worker killed between its
    outputs and the next commit re-reads those inputs and may publish a trajectory again. Every copy
    is the same fact: the event id is uuid5(session id) and the bytes are equal (the core is
    deterministic and the tree does not depend on how inputs interleave), so a consumer that drops
    repeated event ids (`bus.dedupe.Deduplicator`) processes each trajectory exactly once. BatchReady
    copies share uuid5(group id) (their `ready_groups` counter may differ: it counts this worker's
    batches since it started).
    Faust's processing_guarantee="exactly_once" is refused by the config: in faust-streaming 0.15.3
    it puts a message into the transaction of its *destination* partition's group, so Trajectory
    and BatchReady events (keyed by task group) would not commit atomically with the session-keyed
    input that caused them; and with aiokafka 0.14 on Kafka 4.2 a worker stopped in that mode
    hangs ("IllegalOperation: Not in the middle of a transaction").

Failures
    An undecodable message (typed_events), a call the core rejects (malformed, or a known call id
    with other content) and an event of the wrong type go to `dlq` at once, and processing goes on.
    Any other error rebuilds the state from the table (re-putting every entry: the failed write may
    be in RocksDB but not in the changelog) and retries the input twice, then dead-letters it. Kafka
    refusing an output (Trajectory, BatchReady, group record) stops the worker instead: acknowledging
    the input would lose it; the restart re-reads it.

The changelog is the state
    Faust writes a table entry to RocksDB at once and to the changelog asynchronously, and commits
    an input's offset only after its producer flushed (so every write of a committed input is in the
    changelog, and the changelog holds a prefix of the writes of the uncommitted ones). A worker
    killed in between would restart with local entries the changelog lacks; its re-read inputs
    would then be duplicates that write nothing, and a later recovery from the changelog alone would
    find a gap (a session missing deltas waits for its calls forever: lost). So a worker never starts
    on local table files: it deletes them and recovers from the changelogs; the inputs re-read from
    the committed offsets then redo, deterministically, exactly the writes the changelog lacks. A
    rebalance inside a running worker keeps its files (its own writes are all on their way to the
    changelog). The deltas of a session that has a close marker are deleted again after a recovery.

Where each partition starts
    faust-streaming 0.15.3 on aiokafka 0.14 seeks only the partitions that have a committed offset
    above 0; one with messages but no commit was read from about its end, skipping what was
    produced before the worker's fetcher started (the lost sessions of the SIGKILL tests: their
    calls were never read, so they waited for `num_calls` forever, and the skipped offsets left an
    ack gap that kept the partition from ever being committed). After every recovery the worker
    therefore seeks each partition of `llm.calls`, `sessions`, `<app>-groups` and `tasks` to where
    the group resumes it (`bus.consumer.group_start_offsets`: committed, else earliest). And Faust
    fills a jump in a partition's offsets as if acknowledged (for compacted topics), which would let a
    commit pass inputs never processed: the processor replaces that with a seek back (`_refuse_gap`).

Stalled partitions
    A guard: a timer watches the same partitions, and one with messages (highwater read from the
    broker) past the next offset its agent has not seen, and no progress for `stall_timeout_s`, is
    sought back to that offset and logged. Re-reading is safe: the core ignores inputs it has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import struct
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

from agents_adapter.errors import AdapterError, ConfigError, RejectedCallError
from agents_adapter.processor.assembler import AssemblerConfig, Emitted, TrajectoryAssembler
from agents_adapter.processor.group_tracker import GroupTracker
from agents_adapter.processor.session_records import CloseMarker, SessionDelta
from bus.admin import ensure_topics
from bus.config import BusConfig
from bus.consumer import group_start_offsets
from bus.errors import BusError
from bus.faust_app import CODEC, create_faust_app, typed_events
from bus.producer import EventProducer
from bus.topics import TopicSpec, spec
from schemas.events import (
    BatchReady,
    DeadLetter,
    Event,
    LLMCall,
    MetricSample,
    SessionEnded,
    SessionStarted,
    TaskDispatched,
    Trajectory,
    now_ms,
)

log = logging.getLogger("sflow.agents_adapter.processor.trajectories")
_LOG: Final = {"service": "trajectory-processor"}

TICK_METRIC: Final = "trajectory_processor.tick"
_GUARANTEES: Final = ("at_least_once",)
_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
_ATTEMPTS: Final = 3  # tries of an input that fails for an unexpected reason before it is dead-lettered


# --- config ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessorConfig:
    """Settings of the trajectory processor (validated at construction; errors name field and value).

    bus: where Kafka is and the topic prefix.
    app_id: Faust app id below the topic prefix: the consumer group, and the prefix of the
        processor's internal topics (`<app>-ticks`, `<app>-groups`, the table changelogs).
    data_dir: where Faust keeps its RocksDB tables: a cache of the changelogs for one run of the
        worker, deleted at start (module doc: "The changelog is the state").
    producer: the `producer` field of Trajectory and BatchReady events; part of their bytes, so a
        replay that compares bytes must use the same value.
    ttl_ms: a session with no input for this long is closed with status timeout.
    tick_interval_s: how often the TTL timer ticks (a timeout fires at most this late).
    closed_retention_ms: how long a closed session's tombstone (and a fired group's marker) drops
        late inputs; must cover the longest redelivery after a restart.
    group_size: samples per task group when neither TaskDispatched nor the session metadata says
        (None: such groups never produce BatchReady).
    group_size_key: SessionStarted metadata key holding the group size.
    wait_for_calls: keep a session open until SessionEnded.num_calls calls arrived (or the TTL).
    commit_interval_s: Faust's offset commit interval (how much a killed worker re-reads).
    stall_timeout_s: an input partition with unread messages and no progress for this long is
        sought back to its next unprocessed offset (module doc: "Stalled partitions").
    session_timeout_s: Kafka consumer session timeout (how long a killed worker holds its
        partitions before the group rebalances them; the broker's minimum is 6 s).
    processing_guarantee: "at_least_once" only (effectively once with consumer dedupe; the module
        doc says why Faust's "exactly_once" is refused).
    log_level: the worker's log level.
    """

    bus: BusConfig = field(default_factory=BusConfig)
    app_id: str = "trajectory-processor"
    data_dir: Path = Path("data/trajectory-processor")
    producer: str = "trajectory-processor"
    ttl_ms: int = 30 * 60_000
    tick_interval_s: float = 5.0
    closed_retention_ms: int = 3_600_000
    group_size: int | None = None
    group_size_key: str = "n_samples"
    wait_for_calls: bool = True
    commit_interval_s: float = 2.8
    stall_timeout_s: float = 15.0
    session_timeout_s: float = 30.0
    processing_guarantee: str = "at_least_once"
    log_level: str = "warning"

    def __post_init__(self) -> None:
        if not self.app_id or not all(c.isalnum() or c in "._-" for c in self.app_id):
            raise ConfigError(f"app_id must be letters, digits, '.', '_' or '-', got {self.app_id!r}")
        if self.ttl_ms < 1:
            raise ConfigError(f"ttl_ms must be >= 1, got {self.ttl_ms!r}")
        if not 0 < self.tick_interval_s <= 3600:
            raise ConfigError(f"tick_interval_s must be in (0, 3600], got {self.tick_interval_s!r}")
        if not 0 < self.commit_interval_s <= 600:
            raise ConfigError(f"commit_interval_s must be in (0, 600], got {self.commit_interval_s!r}")
        if not 1 <= self.stall_timeout_s <= 3600:
            raise ConfigError(f"stall_timeout_s must be in [1, 3600], got {self.stall_timeout_s!r}")
        if not 6 <= self.session_timeout_s <= 300:
            raise ConfigError(f"session_timeout_s must be in [6, 300] (broker limits), got {self.session_timeout_s!r}")
        if self.processing_guarantee not in _GUARANTEES:
            raise ConfigError(f"processing_guarantee must be 'at_least_once' (outputs are deduplicated by event id;"
                              f" see agents_adapter.processor.trajectories), got {self.processing_guarantee!r}")
        if self.log_level.lower() not in _LEVELS:
            raise ConfigError(f"log_level must be one of {_LEVELS}, got {self.log_level!r}")
        self.assembler_config()  # validates producer, group_size, group_size_key, closed_retention_ms

    def assembler_config(self) -> AssemblerConfig:
        """The core's settings: groups are counted by stage 2, not by the per-partition assemblers."""
        return AssemblerConfig(
            producer=self.producer,
            group_size=self.group_size,
            group_size_key=self.group_size_key,
            closed_retention_ms=self.closed_retention_ms,
            wait_for_calls=self.wait_for_calls,
            track_groups=False,
        )

    @property
    def partitions(self) -> int:
        """Partitions of the session-keyed inputs (from the topic catalog); every internal topic has as many."""
        calls, sessions = spec("llm.calls").partitions, spec("sessions").partitions
        if calls != sessions:
            raise ConfigError(f"llm.calls has {calls} partitions and sessions {sessions}: they must be co-partitioned")
        return calls

    @property
    def ticks_topic(self) -> str:
        return f"{self.app_id}-ticks"

    @property
    def groups_topic(self) -> str:
        return f"{self.app_id}-groups"

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> ProcessorConfig:
        """The worker's command line; the bus comes from the environment (`BusConfig.from_env`)."""
        d = cls.__dataclass_fields__
        p = argparse.ArgumentParser(prog="python -m agents_adapter.processor.trajectories",
                                    description="SeamlessFlow trajectory processor (Faust worker)")
        p.add_argument("--app-id", default=d["app_id"].default)
        p.add_argument("--data-dir", type=Path, default=d["data_dir"].default)
        p.add_argument("--producer", default=d["producer"].default)
        p.add_argument("--ttl-ms", type=int, default=d["ttl_ms"].default)
        p.add_argument("--tick-interval-s", type=float, default=d["tick_interval_s"].default)
        p.add_argument("--closed-retention-ms", type=int, default=d["closed_retention_ms"].default)
        p.add_argument("--group-size", type=int, default=None)
        p.add_argument("--group-size-key", default=d["group_size_key"].default)
        p.add_argument("--no-wait-for-calls", dest="wait_for_calls", action="store_false")
        p.add_argument("--commit-interval-s", type=float, default=d["commit_interval_s"].default)
        p.add_argument("--session-timeout-s", type=float, default=d["session_timeout_s"].default)
        p.add_argument("--stall-timeout-s", type=float, default=d["stall_timeout_s"].default)
        p.add_argument("--processing-guarantee", default=d["processing_guarantee"].default, choices=_GUARANTEES)
        p.add_argument("--log-level", default=d["log_level"].default, choices=_LEVELS)
        args = p.parse_args(argv)
        try:
            bus = BusConfig.from_env(client_id=args.app_id)
        except (BusError, ValueError) as e:
            raise ConfigError(f"bus settings from the environment: {e}") from e
        return cls(bus=bus, **{k: v for k, v in vars(args).items()})


# --- table keys --------------------------------------------------------------------------------

_KEY_HEAD = struct.Struct(">cHH")
_SEQ = struct.Struct(">I")
_TS = struct.Struct("<q")
DELTA, CLOSED, GROUP, FIRED = b"d", b"c", b"g", b"f"


@dataclass(frozen=True, slots=True)
class TableKey:
    """A parsed table key: kind (DELTA, CLOSED, GROUP, FIRED), partition, entity id, delta seq."""

    kind: bytes
    partition: int
    entity: str
    seq: int = 0

    def to_bytes(self) -> bytes:
        raw = self.entity.encode()
        head = _KEY_HEAD.pack(self.kind, self.partition, len(raw)) + raw
        return head + _SEQ.pack(self.seq) if self.kind == DELTA else head

    @classmethod
    def from_bytes(cls, data: bytes) -> TableKey:
        try:
            kind, partition, n = _KEY_HEAD.unpack_from(data, 0)
            end = _KEY_HEAD.size + n
            entity = bytes(data[_KEY_HEAD.size:end]).decode()
            seq = _SEQ.unpack_from(data, end)[0] if kind == DELTA else 0
            if len(data) != end + (_SEQ.size if kind == DELTA else 0) or kind not in (DELTA, CLOSED, GROUP, FIRED):
                raise ValueError(f"kind {kind!r}, {len(data)} bytes")
        except (struct.error, UnicodeDecodeError, ValueError) as e:
            raise AdapterError(f"not a trajectory-processor table key: {data[:40]!r}: {e}") from e
        return cls(kind, partition, entity, seq)


# --- stage 2 records ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupRecord:
    """What stage 1 (or a TaskDispatched) tells stage 2 about a group, on `<app>-groups` keyed by group.

    kind "member": a closed session's trajectory (size = the session's group size from its
    metadata, 0 if none); kind "size": a group's size from TaskDispatched.
    """

    kind: str
    group_id: str
    task_id: str = ""
    size: int = 0
    trajectory_id: str = ""
    min_version: int = -1
    max_version: int = -1
    ts_ms: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> GroupRecord:
        try:
            record = cls(**json.loads(data))
        except (ValueError, TypeError) as e:
            raise AdapterError(f"undecodable group record: {e}") from e
        if record.kind not in ("member", "size") or not record.group_id or record.size < 0:
            raise AdapterError(f"invalid group record {record!r}")
        return record


def _group_value(tracker: GroupTracker, group_id: str) -> bytes | None:
    state = tracker.group_state(group_id)
    if state is None:
        return None
    return json.dumps({"size": state.size, "task": state.task_id, "members": state.members}).encode()


def _restore_group(tracker: GroupTracker, group_id: str, value: bytes) -> list[BatchReady]:
    data = json.loads(value)
    batches = [tracker.expect(group_id, data["size"], data["task"])] if data["size"] else []
    batches += [tracker.add_member(group_id, tid, data["task"], lo, hi, ts) for tid, lo, hi, ts in data["members"]]
    return [b for b in batches if b is not None]


# --- per-partition state -----------------------------------------------------------------------


@dataclass
class _Partition:
    """Stage-1 state of one input partition: the assembler and what the shell knows of its table."""

    assembler: TrajectoryAssembler
    stored: dict[str, int] = field(default_factory=dict)  # open session -> deltas in the table (seq 0..n-1)
    group_sizes: dict[str, int] = field(default_factory=dict)
    closed: dict[str, int] = field(default_factory=dict)  # tombstones in the table: session -> close ts
    pending: list[tuple[bytes, bytes | None]] = field(default_factory=list)  # writes for the next event


@dataclass
class _Groups:
    """Stage-2 state of one groups partition."""

    stored: set[str] = field(default_factory=set)
    fired: dict[str, int] = field(default_factory=dict)
    pending: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    pending_batches: list[BatchReady] = field(default_factory=list)
    last_cleanup_ms: int = 0


# --- the processor -----------------------------------------------------------------------------


class TrajectoryProcessor:
    """Builds the Faust app (agents, tables, timer) for a config; `worker` runs it."""

    def __init__(self, config: ProcessorConfig) -> None:
        self.config = config
        self.bus = config.bus
        self.n_partitions = config.partitions
        self.app: Any = create_faust_app(
            config.app_id,
            config.bus,
            config.data_dir,
            topic_partitions=self.n_partitions,
            broker_commit_interval=config.commit_interval_s,
            broker_session_timeout=config.session_timeout_s,
            broker_heartbeat_interval=min(3.0, config.session_timeout_s / 4),
            processing_guarantee=config.processing_guarantee,
        )
        self.group_id = self.app.conf.id
        self._drop_local_tables()
        self.app.consumer._add_gap = self._refuse_gap  # module doc: "Where each partition starts"
        self._dlq: EventProducer | None = None
        self._partitions: dict[int, _Partition] = {}
        self._groups: dict[int, _Groups] = defaultdict(_Groups)
        self._seek_tasks: set[asyncio.Task[None]] = set()
        self._progress: dict[tuple[str, int], tuple[int, float]] = {}  # input tp -> next offset, when it moved
        self.tracker = GroupTracker(config.group_size, config.producer)
        self._define()

    # --- wiring ---

    def _define(self) -> None:
        app, bus, cfg = self.app, self.bus, self.config
        options = {"write_buffer_size": 8 << 20, "block_cache_size": 64 << 20, "max_open_files": 256}
        self.sessions_table = app.Table("sessions", key_type=bytes, value_type=bytes,
                                        partitions=self.n_partitions, options=options)
        self.groups_table = app.Table("groups", key_type=bytes, value_type=bytes,
                                      partitions=self.n_partitions, options=options)
        self.sessions_table.on_recover(self._on_sessions_recovered)
        self.groups_table.on_recover(self._on_groups_recovered)
        self.calls_topic_name = bus.topic("llm.calls")
        self.ticks_topic_name = bus.topic(cfg.ticks_topic)
        self.ticks = app.topic(self.ticks_topic_name, value_serializer=CODEC, key_serializer="raw")
        inputs = app.topic(self.calls_topic_name, bus.topic("sessions"), self.ticks_topic_name,
                           value_serializer=CODEC, key_serializer="raw")
        self.out = app.topic(bus.topic("trajectories"), value_serializer=CODEC, key_serializer="raw")
        self.group_records = app.topic(bus.topic(cfg.groups_topic), value_serializer="raw", key_serializer="raw")
        tasks = app.topic(bus.topic("tasks"), value_serializer=CODEC, key_serializer="raw")
        app.agent(inputs, name="session-stage")(self._sessions_agent)
        app.agent(self.group_records, name="group-stage")(self._groups_agent)
        app.agent(tasks, name="task-sizes")(self._tasks_agent)
        app.timer(cfg.tick_interval_s)(self._tick)
        app.timer(max(1.0, cfg.stall_timeout_s / 3))(self._unstall_inputs)

    @property
    def _sought_topics(self) -> set[str]:
        """The topics whose partitions are sought after a recovery and watched for stalls (not the ticks)."""
        cfg = self.config
        return {self.calls_topic_name, self.bus.topic("sessions"), self.bus.topic(cfg.groups_topic),
                self.bus.topic("tasks")}

    def internal_topics(self) -> list[TopicSpec]:
        """The processor's own topics, co-partitioned with the inputs. The table changelogs are created
        here too, not lazily by Faust: a changelog missing from the consumer's first metadata makes
        Faust refuse every table write of that run (PartitionsMismatch: "changelog has 0 partitions")."""
        hour, n, app_id = 3_600_000, self.n_partitions, self.config.app_id
        return [
            TopicSpec(self.config.ticks_topic, n, "partition", (MetricSample,), retention_ms=hour),
            TopicSpec(self.config.groups_topic, n, "group", (), retention_ms=7 * 24 * hour),
            TopicSpec(f"{app_id}-sessions-changelog", n, "table key", (), compacted=True),
            TopicSpec(f"{app_id}-groups-changelog", n, "table key", (), compacted=True),
        ]

    def prepare_topics(self) -> None:
        """Creates the catalog topics it reads and writes and its internal topics (idempotent)."""
        needed = [spec(n) for n in ("llm.calls", "sessions", "trajectories", "tasks", "dlq")]
        ensure_topics(self.bus, [*needed, *self.internal_topics()])

    def _drop_local_tables(self) -> None:
        """Starts every worker from the changelogs alone (module doc: "The changelog is the state")."""
        tables = Path(self.app.conf.tabledir)
        if tables.is_dir():
            shutil.rmtree(tables)
            log.info("dropped the local table files under %s: recovering from the changelogs", tables, extra=_LOG)

    @property
    def dlq(self) -> EventProducer:
        if self._dlq is None:
            self._dlq = EventProducer(self.bus, producer_id=f"{self.config.producer}-dlq")
        return self._dlq

    # --- stage 1: sessions ---

    async def _sessions_agent(self, stream: Any) -> None:
        async for event in typed_events(stream, self.dlq, self.bus, self.group_id):
            message = stream.current_event.message
            self._seen(message)
            await self._handle_with_retries(
                message, partial(self._on_input, message.partition, message.topic, event),
                partial(self._rebuild_sessions, resync=True))

    async def _handle_with_retries(self, message: Any, handle: Callable[[], Awaitable[None]],
                                   rebuild: Callable[[], None]) -> None:
        """Runs `handle` for one input. When it fails for a reason the core did not name (not a rejected
        call), `rebuild` restores the state from the table, with every entry re-put (the failed write may
        be in RocksDB but not in the changelog); the input is retried after a pause (metadata lag, a
        broker hiccup), then dead-lettered."""
        for attempt in range(_ATTEMPTS):
            try:
                await handle()
                return
            except (PublishFailed, asyncio.CancelledError):
                raise
            except Exception as e:
                rebuild()
                log.exception("%s[%d]@%d failed (attempt %d of %d)", message.topic, message.partition,
                              message.offset, attempt + 1, _ATTEMPTS, extra=_LOG)
                if attempt + 1 < _ATTEMPTS:
                    await asyncio.sleep(0.5 * (attempt + 1))
                else:
                    await self._dead_letter(message, f"processing failed: {type(e).__name__}: {e}")

    async def _on_input(self, p: int, topic: str, event: Event) -> None:
        part = self._partition(p)
        self._flush_pending(self.sessions_table, part.pending)
        is_tick_topic = topic == self.ticks_topic_name
        if is_tick_topic and isinstance(event, MetricSample) and event.name == TICK_METRIC:
            emitted = part.assembler.expire(event.ts_ms, self.config.ttl_ms)
            self._forget_tombstones(p, part, event.ts_ms - self.config.closed_retention_ms)
        elif not is_tick_topic and isinstance(event, (LLMCall, SessionStarted, SessionEnded)):
            try:
                emitted = part.assembler.on_event(event)
            except RejectedCallError as e:
                await self._dead_letter(self._current_message(), f"rejected call: {e}")
                return
        else:
            await self._dead_letter(self._current_message(), f"unexpected {event.event_type} on {topic}")
            return
        await self._apply(p, part, emitted)

    async def _apply(self, p: int, part: _Partition, emitted: Emitted) -> None:
        """Outputs of one input, in the order that makes a crash at any point safe (module doc)."""
        closing = set(emitted.closed_sessions)
        for delta in emitted.deltas:
            if delta.group_size:
                part.group_sizes[delta.session_id] = delta.group_size
        for trajectory in emitted.trajectories:
            await self._publish(trajectory)
            size = part.group_sizes.get(trajectory.session_id, 0)
            if trajectory.group_id:
                await self._send_group_record(GroupRecord(
                    "member", trajectory.group_id, trajectory.task_id, size, trajectory.trajectory_id,
                    trajectory.min_version, trajectory.max_version, trajectory.ts_ms))
        table = self.sessions_table
        for delta in emitted.deltas:
            if delta.session_id in closing:
                continue
            if delta.seq != part.stored.get(delta.session_id, 0):
                raise AdapterError(f"session {delta.session_id!r}: delta seq {delta.seq} does not follow the table")
            table[TableKey(DELTA, p, delta.session_id, delta.seq).to_bytes()] = delta.to_bytes()
            part.stored[delta.session_id] = delta.seq + 1
        for trajectory in emitted.trajectories:
            # the marker before the deletes: a crash between them leaves a marker that a recovery
            # honours (it deletes the leftovers), never deltas without a marker that re-read inputs
            # would re-open as a new, partial session
            sid = trajectory.session_id
            marker = CloseMarker.of(trajectory.ts_ms, trajectory.call_ids)
            table[TableKey(CLOSED, p, sid).to_bytes()] = marker.to_bytes()
            part.closed[sid] = trajectory.ts_ms
            for seq in range(part.stored.pop(sid, 0)):
                del table[TableKey(DELTA, p, sid, seq).to_bytes()]
            part.group_sizes.pop(sid, None)
        await self._wait_buffered()

    def _forget_tombstones(self, p: int, part: _Partition, horizon_ms: int) -> None:
        for sid in [s for s, ts in part.closed.items() if ts < horizon_ms]:
            del self.sessions_table[TableKey(CLOSED, p, sid).to_bytes()]
            del part.closed[sid]

    def _partition(self, p: int) -> _Partition:
        part = self._partitions.get(p)
        if part is None:
            part = self._partitions[p] = _Partition(TrajectoryAssembler(self.config.assembler_config()))
        return part

    async def _on_sessions_recovered(self) -> None:
        """After every rebalance: the assemblers of this worker's partitions, rebuilt from the table, and
        each input partition sought to where the group resumes it (`bus.consumer.group_start_offsets`)."""
        self._rebuild_sessions(resync=False)
        consumer, inputs = self.app.consumer, self._sought_topics
        tps = {(tp.topic, tp.partition): tp for tp in consumer.assignment() if tp.topic in inputs}
        starts = await asyncio.to_thread(group_start_offsets, self.bus, self.group_id, sorted(tps))
        now = time.monotonic()
        for key, offset in starts.items():
            await consumer.seek(tps[key], offset)
            self._progress[key] = (offset, now)

    def _rebuild_sessions(self, resync: bool) -> None:
        deltas: dict[tuple[int, str], list[tuple[int, bytes]]] = defaultdict(list)
        tombstones: list[tuple[TableKey, CloseMarker]] = []
        raw_items: list[tuple[bytes, bytes]] = []
        for raw_key, value in self.sessions_table.items():
            key = TableKey.from_bytes(raw_key)
            if resync:
                raw_items.append((raw_key, value))
            if key.kind == DELTA:
                deltas[(key.partition, key.entity)].append((key.seq, value))
            elif key.kind == CLOSED:
                tombstones.append((key, CloseMarker.from_bytes(value)))
        self._partitions = {}
        for key, marker in tombstones:
            part = self._partition(key.partition)
            part.assembler.restore_closed(key.entity, marker)
            part.closed[key.entity] = marker.ts_ms
        restored = 0
        for (p, sid), entries in sorted(deltas.items()):
            part = self._partition(p)
            entries.sort()
            if sid in part.closed:  # closed, but the deletes did not reach the changelog: delete again
                part.pending += [(TableKey(DELTA, p, sid, seq).to_bytes(), None) for seq, _ in entries]
                continue
            for i, (seq, value) in enumerate(entries):
                try:
                    delta = SessionDelta.from_bytes(value)
                    part.assembler.restore(delta)
                except AdapterError as e:  # cannot happen with in-order writes; keep the prefix, drop the rest
                    log.error("session %s restored from %d of its %d table entries (seqs %s): %s", sid, i,
                              len(entries), [s for s, _ in entries], e, extra={**_LOG, "session": sid})
                    part.pending += [(TableKey(DELTA, p, sid, s).to_bytes(), None) for s, _ in entries[i:]]
                    break
                if delta.group_size:
                    part.group_sizes[sid] = delta.group_size
                part.stored[sid] = seq + 1
            restored += sid in part.stored
        deleting = {key for part in self._partitions.values() for key, value in part.pending if value is None}
        for raw_key, value in raw_items:
            if raw_key not in deleting:
                self._partition(TableKey.from_bytes(raw_key).partition).pending.append((raw_key, value))
        log.info("recovered %d open sessions, %d closed markers%s", restored, len(tombstones),
                 f", re-putting {len(raw_items)} entries" if resync else "", extra=_LOG)

    # --- stage 2: groups ---

    async def _tasks_agent(self, stream: Any) -> None:
        async for event in typed_events(stream, self.dlq, self.bus, self.group_id):
            self._seen(stream.current_event.message)
            if isinstance(event, TaskDispatched) and event.group_id and event.n_samples > 0:
                await self._send_group_record(GroupRecord("size", event.group_id, event.task_id, event.n_samples))

    async def _groups_agent(self, stream: Any) -> None:
        async for fevent in stream.events():
            message = fevent.message
            self._seen(message)
            try:
                record = GroupRecord.from_bytes(fevent.value)
            except AdapterError as e:
                await self._dead_letter(message, str(e))
                continue
            await self._handle_with_retries(
                message, partial(self._on_group_record, message.partition, record),
                partial(self._rebuild_groups, resync=True))

    async def _on_group_record(self, p: int, record: GroupRecord) -> None:
        state = self._groups[p]
        table, tracker, gid = self.groups_table, self.tracker, record.group_id
        self._flush_pending(table, state.pending)
        for batch in state.pending_batches:
            await self._fired(p, state, batch)
        state.pending_batches.clear()
        batches = [tracker.expect(gid, record.size, record.task_id)] if record.size else []
        if record.kind == "member":
            batches.append(tracker.add_member(gid, record.trajectory_id, record.task_id, record.min_version,
                                              record.max_version, record.ts_ms))
        fired = [b for b in batches if b is not None]
        for batch in fired:
            await self._fired(p, state, batch)
        if not fired:
            value = _group_value(tracker, gid)
            if value is not None:
                table[TableKey(GROUP, p, gid).to_bytes()] = value
                state.stored.add(gid)
        self._cleanup_groups(p, state)
        await self._wait_buffered()

    async def _fired(self, p: int, state: _Groups, batch: BatchReady) -> None:
        """Publishes a BatchReady, then replaces the group's entry by its fired marker."""
        await self._publish(batch)
        gid = batch.group_id
        self.groups_table[TableKey(FIRED, p, gid).to_bytes()] = _TS.pack(batch.ts_ms)  # marker first
        state.fired[gid] = batch.ts_ms
        if gid in state.stored:
            del self.groups_table[TableKey(GROUP, p, gid).to_bytes()]
            state.stored.discard(gid)

    def _cleanup_groups(self, p: int, state: _Groups) -> None:
        now = now_ms()
        if now - state.last_cleanup_ms < 60_000:
            return
        state.last_cleanup_ms = now
        horizon = now - self.config.closed_retention_ms
        for gid in [g for g, ts in state.fired.items() if ts < horizon]:
            del self.groups_table[TableKey(FIRED, p, gid).to_bytes()]
            del state.fired[gid]
        self.tracker.forget(horizon)

    async def _on_groups_recovered(self) -> None:
        self._rebuild_groups(resync=False)

    def _rebuild_groups(self, resync: bool) -> None:
        self.tracker = GroupTracker(self.config.group_size, self.config.producer)
        self._groups = defaultdict(_Groups)
        for raw_key, value in self.groups_table.items():
            key = TableKey.from_bytes(raw_key)
            state = self._groups[key.partition]
            if resync:
                state.pending.append((raw_key, value))
            if key.kind == FIRED:
                ts = _TS.unpack(value)[0]
                self.tracker.restore_done(key.entity, ts)
                state.fired[key.entity] = ts
            elif key.kind == GROUP and self.tracker.is_done(key.entity):  # fired: its entry outlived a crash
                state.pending.append((raw_key, None))
            elif key.kind == GROUP:
                state.pending_batches += _restore_group(self.tracker, key.entity, value)
                state.stored.add(key.entity)

    # --- timer ---

    async def _tick(self) -> None:
        """Sends one tick to each input partition this worker owns (the TTL runs in stage 1)."""
        now = now_ms()
        owned = sorted(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == self.calls_topic_name)
        for p in owned:
            tick = MetricSample(ts_ms=now, producer=self.config.producer, correlation_id=str(p),
                                service=self.config.producer, name=TICK_METRIC, value=float(now),
                                labels={"partition": str(p)})
            await self.ticks.send(value=tick, partition=p)

    # --- stalled partitions ---

    async def _refuse_gap(self, tp: Any, offset_from: int, offset_to: int) -> None:
        """Faust counts a jump in a partition's offsets as acknowledged, so its next commit would pass
        inputs never processed. Our topics have no gaps (not compacted, no transaction markers): a jump
        means the fetcher skipped messages, so they stay unacknowledged and the partition is sought back
        to the first one once the message after the jump has been read (Faust drops re-fetched offsets
        below the last one it read, so an earlier seek would be undone)."""
        log.warning("%s[%d]: offsets %d-%d skipped by the fetcher; seeking back to %d", tp.topic, tp.partition,
                    offset_from, offset_to - 1, offset_from, extra=_LOG)
        task = asyncio.get_running_loop().create_task(self._seek_back(tp, offset_from, offset_to))
        self._seek_tasks.add(task)
        task.add_done_callback(self._seek_tasks.discard)

    async def _seek_back(self, tp: Any, offset: int, after: int) -> None:
        consumer = self.app.consumer
        for _ in range(1000):  # bounded: the message after the jump is read within milliseconds
            read = consumer._read_offset.get(tp)
            if read is not None and read >= after:
                break
            await asyncio.sleep(0.01)
        await consumer.seek(tp, offset)

    def _seen(self, message: Any) -> None:
        self._progress[(message.topic, message.partition)] = (message.offset + 1, time.monotonic())

    async def _unstall_inputs(self) -> None:
        """Seeks each stalled input partition back to its next unprocessed offset (module doc)."""
        consumer, now = self.app.consumer, time.monotonic()
        inputs = self._sought_topics
        tps = sorted(tp for tp in consumer.assignment() if tp.topic in inputs)
        if not tps:
            return
        try:  # from the broker: a partition the fetcher stopped fetching has no local highwater
            ends = await consumer.highwaters(*tps)
        except Exception as e:
            log.warning("cannot read the input highwaters: %s", e, extra=_LOG)
            return
        for tp in tps:
            high = ends.get(tp)
            if high is None:
                continue
            next_offset, moved = self._progress.setdefault((tp.topic, tp.partition), (0, now))
            if high <= next_offset or now - moved < self.config.stall_timeout_s:
                continue
            log.warning("input %s[%d] stalled at offset %d (highwater %d) for %.0f s: seeking back to it",
                        tp.topic, tp.partition, next_offset, high, now - moved, extra=_LOG)
            await consumer.seek(tp, next_offset)
            self._progress[(tp.topic, tp.partition)] = (next_offset, now)

    # --- output ---

    async def _publish(self, event: Trajectory | BatchReady) -> None:
        """Publishes to `trajectories` and waits until Kafka acknowledged it (before the input is acked)."""
        try:
            pending = await self.out.send(key=event.key.encode(), value=event)
            await pending
        except Exception as e:
            await self._fail(f"publishing {event.event_type} {event.correlation_id}", e)

    async def _send_group_record(self, record: GroupRecord) -> None:
        try:
            pending = await self.group_records.send(key=record.group_id.encode(), value=record.to_bytes())
            await pending
        except Exception as e:
            await self._fail(f"sending the group record of {record.group_id}", e)

    async def _fail(self, what: str, error: Exception) -> None:
        """Kafka refused an output: stop the worker (its restart re-reads the unacknowledged inputs)."""
        log.critical("%s failed: %s; stopping the worker", what, error, extra=_LOG)
        failure = PublishFailed(f"{what}: {error}")
        await self.app.crash(failure)
        raise failure from error

    def _flush_pending(self, table: Any, pending: list[tuple[bytes, bytes | None]]) -> None:
        """Table writes decided outside an event (recovery), done in the first event of their partition."""
        for key, value in pending:
            if value is None:
                del table[key]
            else:
                table[key] = value
        pending.clear()

    async def _wait_buffered(self) -> None:
        """Waits until Faust's producer buffer handed the changelog writes to the Kafka client, so the
        commit's flush covers them (the buffer's own flush gives up on a slow send)."""
        buffer = self.app.producer.buffer
        for _ in range(10_000):
            if not buffer.size:
                return
            await asyncio.sleep(0.001)

    def _current_message(self) -> Any:
        from faust import current_event

        event = current_event()
        if event is None:
            raise AdapterError("no current Faust event")
        return event.message

    async def _dead_letter(self, message: Any, reason: str) -> None:
        letter = DeadLetter(
            source_topic=message.topic,
            source_partition=message.partition,
            source_offset=message.offset,
            key_bytes=message.key if isinstance(message.key, bytes) else None,
            value=message.value if isinstance(message.value, bytes) else None,
            reason=reason,
            consumer_group=self.group_id,
            correlation_id=f"{message.topic}:{message.partition}:{message.offset}",
            producer=self.config.producer,
        )
        await self.dlq.publish_async(letter, topic=self.bus.topic("dlq"))
        log.warning("dead-lettered %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason,
                    extra=_LOG)


class PublishFailed(AdapterError):
    """Kafka did not take an output; the worker stops rather than acknowledge the input."""


def worker(config: ProcessorConfig) -> None:
    """Creates the topics, then runs the processor until it is stopped (SIGTERM / SIGINT)."""
    import faust
    from aiokafka.codec import has_lz4

    if not has_lz4():
        log.error("Faust's Kafka client (aiokafka) cannot decompress lz4 batches, which bus.producer writes:"
                  " install cramjam, or the worker stops at the first compressed input", extra=_LOG)
    processor = TrajectoryProcessor(config)
    processor.prepare_topics()
    log.info("trajectory processor %s on %s", processor.group_id, config.bus.bootstrap_servers, extra=_LOG)
    faust.Worker(processor.app, loglevel=config.log_level, quiet=True).execute_from_commandline()


def main(argv: Iterable[str] | None = None) -> None:
    try:
        config = ProcessorConfig.from_args(list(argv) if argv is not None else None)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    os.makedirs(config.data_dir, exist_ok=True)
    worker(config)


if __name__ == "__main__":
    main()
