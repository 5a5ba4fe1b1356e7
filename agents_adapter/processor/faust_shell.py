"""The trajectory processor's Faust shell: the app, its agents, tables, timers and recovery hooks
around the two stages (`session_stage`, `group_stage`; docs/architecture.md).

Run it with `python -m agents_adapter.processor [options]` (`config.ProcessorConfig.from_args`) or
`worker(ProcessorConfig(...))`. The table entries are described in `table_codec`.

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

Where each partition starts, gaps, stalled partitions
    Faust 0.15.3 / aiokafka 0.14 behaviours that would skip inputs: the worker seeks every partition
    of `llm.calls`, `sessions`, `<app>-groups` and `tasks` to where the group resumes it after each
    recovery, refuses offset gaps and unsticks stalled partitions (`bus.faust_recovery.InputGuard`,
    whose module doc explains each). With no broker reachable for `broker_lost_timeout_s` the worker
    exits with status 3 (`bus.faust_liveness`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Final

from agents_adapter.errors import AdapterError
from agents_adapter.processor.config import ProcessorConfig
from agents_adapter.processor.group_stage import GroupStage
from agents_adapter.processor.session_stage import TICK_METRIC, Output, SessionStage
from agents_adapter.processor.table_codec import GroupRecord
from bus.admin import ensure_topics
from bus.deadletter import dead_letter
from bus.errors import BusError
from bus.faust_app import CODEC, create_faust_app, typed_events
from bus.faust_liveness import exit_when_broker_lost
from bus.faust_recovery import BufferHandoff, InputGuard, drop_local_tables
from bus.metrics import ServiceMetrics
from bus.producer import EventProducer
from bus.retry import Backoff, retry_async
from bus.topics import TopicSpec, spec
from schemas.events import Event, MetricSample, TaskDispatched, now_ms

log = logging.getLogger("sflow.agents_adapter.processor")
_LOG: Final = {"service": "trajectory-processor"}

# Tries of an input that fails for an unexpected reason before it is dead-lettered (pauses 0.5 s, then 1 s).
_RETRIES: Final = Backoff(attempts=3, first_s=0.5, growth="linear")


class PublishFailed(AdapterError):
    """Kafka did not take an output; the worker stops rather than acknowledge the input."""


class TrajectoryProcessor:
    """Builds the Faust app (agents, tables, timers) for a config; `worker` runs it."""

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
            # Faust refuses a session timeout above the request timeout (default 90 s); the config allows 300
            broker_request_timeout=max(90.0, config.session_timeout_s),
            broker_heartbeat_interval=min(3.0, config.session_timeout_s / 4),
            consumer_group_instance_id=config.group_instance_id,
            processing_guarantee=config.processing_guarantee,
        )
        self.group_id = self.app.conf.id
        drop_local_tables(self.app)  # "The changelog is the state"
        self.handoff = BufferHandoff(self.app)
        bus = self.bus
        self.calls_topic_name = bus.topic("llm.calls")
        self.ticks_topic_name = bus.topic(config.ticks_topic)
        sought = (self.calls_topic_name, bus.topic("sessions"), bus.topic(config.groups_topic), bus.topic("tasks"))
        self.guard = InputGuard(self.app, bus, self.group_id, sought, config.stall_timeout_s)
        self._dlq: EventProducer | None = None
        self.published: Counter[str] = Counter()  # Trajectory / BatchReady events Kafka acknowledged
        self.dead_lettered = 0
        self.metrics = ServiceMetrics("processor")
        self.metrics.read("sflow_processor_trajectories_total", lambda: self.published["Trajectory"])
        self.metrics.read("sflow_processor_batches_ready_total", lambda: self.published["BatchReady"])
        self.metrics.watch_consumer(self.group_id, self.guard.lag, lambda: self.dead_lettered)
        self._define()

    # --- wiring ---

    def _define(self) -> None:
        app, bus, cfg = self.app, self.bus, self.config
        options = {"write_buffer_size": 8 << 20, "block_cache_size": 64 << 20, "max_open_files": 256}
        self.sessions_table = app.Table("sessions", key_type=bytes, value_type=bytes,
                                        partitions=self.n_partitions, options=options)
        self.groups_table = app.Table("groups", key_type=bytes, value_type=bytes,
                                      partitions=self.n_partitions, options=options)
        self.sessions = SessionStage(cfg, self.sessions_table, self._publish_output, self.ticks_topic_name)
        self.groups = GroupStage(cfg, self.groups_table, self._publish_output)
        self.sessions_table.on_recover(self._on_sessions_recovered)
        self.groups_table.on_recover(self._on_groups_recovered)
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
        app.timer(max(1.0, cfg.stall_timeout_s / 3))(self.guard.unstall)

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

    @property
    def dlq(self) -> EventProducer:
        if self._dlq is None:
            self._dlq = EventProducer(self.bus, producer_id=f"{self.config.producer}-dlq")
        return self._dlq

    # --- agents ---

    async def _sessions_agent(self, stream: Any) -> None:
        async for message, event in typed_events(self.guard.admitted(stream), self.dlq, self.bus, self.group_id):
            await self._handle_with_retries(
                message, partial(self._on_input, message.partition, message.topic, event),
                partial(self.sessions.rebuild, resync=True))

    async def _on_input(self, p: int, topic: str, event: Event) -> None:
        reason = await self.sessions.on_input(p, topic, event)
        if reason is not None:
            await self._dead_letter(self._current_message(), reason)
        else:
            await self._wait_handed()

    async def _tasks_agent(self, stream: Any) -> None:
        async for _, event in typed_events(self.guard.admitted(stream), self.dlq, self.bus, self.group_id):
            if isinstance(event, TaskDispatched) and event.group_id and event.n_samples > 0:
                await self._send_group_record(GroupRecord("size", event.group_id, event.task_id, event.n_samples))

    async def _groups_agent(self, stream: Any) -> None:
        async for fevent in self.guard.admitted(stream):
            message = fevent.message
            try:
                record = GroupRecord.from_bytes(fevent.value)
            except AdapterError as e:
                await self._dead_letter(message, str(e))
                continue
            await self._handle_with_retries(
                message, partial(self._on_group_record, message.partition, record),
                partial(self.groups.rebuild, resync=True))

    async def _on_group_record(self, p: int, record: GroupRecord) -> None:
        await self.groups.on_record(p, record)
        await self._wait_handed()

    async def _handle_with_retries(self, message: Any, handle: Callable[[], Awaitable[None]],
                                   rebuild: Callable[[], None]) -> None:
        """Runs `handle` for one input. When it fails for a reason the core did not name (not a rejected
        call), `rebuild` restores the state from the table, with every entry re-put (the failed write may
        be in RocksDB but not in the changelog); the input is retried after a pause (metadata lag, a
        broker hiccup), then dead-lettered."""
        last: Exception | None = None

        def failed(attempt: int, e: Exception) -> None:
            nonlocal last
            last = e
            rebuild()
            log.exception("%s[%d]@%d failed (attempt %d of %d)", message.topic, message.partition,
                          message.offset, attempt, _RETRIES.attempts, extra=_LOG)

        try:
            await retry_async(handle, _RETRIES, on_failure=failed, never_retry=(PublishFailed, asyncio.CancelledError))
        except Exception as e:
            if e is not last:  # a refused output (PublishFailed) or a failed rebuild stops the worker
                raise
            await self._dead_letter(message, f"processing failed: {type(e).__name__}: {e}")

    # --- recovery and timers ---

    async def _on_sessions_recovered(self) -> None:
        """After every rebalance: the assemblers of this worker's partitions, rebuilt from the table, and
        each input partition sought to where the group resumes it (`bus.consumer.group_start_offsets`)."""
        self.sessions.rebuild(resync=False)
        await self.guard.seek_to_group_start()

    async def _on_groups_recovered(self) -> None:
        self.groups.rebuild(resync=False)

    async def _tick(self) -> None:
        """Sends one tick to each input partition this worker owns (the TTL runs in stage 1)."""
        now = now_ms()
        owned = sorted(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == self.calls_topic_name)
        for p in owned:
            tick = MetricSample(ts_ms=now, producer=self.config.producer, correlation_id=str(p),
                                service=self.config.producer, name=TICK_METRIC, value=float(now),
                                labels={"partition": str(p)})
            await self.ticks.send(value=tick, partition=p)

    # --- output ---

    async def _publish_output(self, output: Output) -> None:
        """The stages' publish callback: Trajectory and BatchReady to `trajectories`, group records to
        `<app>-groups`; returns once Kafka acknowledged it (before the input is acked)."""
        if isinstance(output, GroupRecord):
            await self._send_group_record(output)
            return
        try:
            pending = await self.out.send(key=output.key.encode(), value=output)
            await pending
        except Exception as e:
            await self._fail(f"publishing {output.event_type} {output.correlation_id}", e)
        self.published[output.event_type] += 1

    async def _send_group_record(self, record: GroupRecord) -> None:
        try:
            pending = await self.group_records.send(key=record.group_id.encode(), value=record.to_bytes())
            await pending
        except Exception as e:
            await self._fail(f"sending the group record of {record.group_id}", e)

    async def _wait_handed(self) -> None:
        """An input's table writes in the Kafka client before it is acked (bus.faust_recovery.BufferHandoff)."""
        try:
            await self.handoff.wait_handed()
        except BusError as e:
            await self._fail("handing the changelog writes to Kafka", e)

    async def _fail(self, what: str, error: Exception) -> None:
        """Kafka refused an output: stop the worker (its restart re-reads the unacknowledged inputs)."""
        log.critical("%s failed: %s; stopping the worker", what, error, extra=_LOG)
        failure = PublishFailed(f"{what}: {error}")
        await self.app.crash(failure)
        raise failure from error

    def _current_message(self) -> Any:
        from faust import current_event

        event = current_event()
        if event is None:
            raise AdapterError("no current Faust event")
        return event.message

    async def _dead_letter(self, message: Any, reason: str) -> None:
        letter = dead_letter(message.topic, message.partition, message.offset, key=message.key, value=message.value,
                             reason=reason, consumer_group=self.group_id, producer=self.config.producer)
        await self.dlq.publish_async(letter, topic=self.bus.topic("dlq"))
        self.dead_lettered += 1
        log.warning("dead-lettered %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason,
                    extra=_LOG)


def worker(config: ProcessorConfig) -> None:
    """Creates the topics, then runs the processor until it is stopped (SIGTERM / SIGINT), or until no
    broker was reachable for `broker_lost_timeout_s` (exit status 3)."""
    import faust
    from aiokafka.codec import has_lz4

    if not has_lz4():
        log.error("Faust's Kafka client (aiokafka) cannot decompress lz4 batches, which bus.producer writes:"
                  " install cramjam, or the worker stops at the first compressed input", extra=_LOG)
    exit_when_broker_lost(config.bus.bootstrap_servers, config.broker_lost_timeout_s)
    processor = TrajectoryProcessor(config)
    processor.prepare_topics()
    if config.metrics_port is not None:  # a daemon thread: it ends with the worker's process
        processor.metrics.serve(config.metrics_host, config.metrics_port)
    log.info("trajectory processor %s on %s", processor.group_id, config.bus.bootstrap_servers, extra=_LOG)
    faust_worker = faust.Worker(processor.app, loglevel=config.log_level, quiet=True)
    # Faust's start-up spinner sets the root logger to DEBUG to animate on every record, for the whole run: each
    # debug line of aiokafka and Faust then builds a LogRecord (docs/architecture.md, "The hot path, as built").
    faust_worker.spinner = None
    faust_worker.execute_from_commandline()
