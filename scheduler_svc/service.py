"""The scheduler service: the imperative shell around the scheduler core (`python -m scheduler_svc`).

It consumes `resources`, `trajectories`, `train`, `weights` and `control`, turns each event into core
observations (`journal.JournaledScheduler`: which event gives which observation, which decision gives
which event), calls `Scheduler.handle`, and publishes every decision as an event with the idempotent
producer. Events it produced itself (its ResourceLost on `resources`, its commands on `control`, ...)
are not inputs.

Event sourcing: a write-ahead journal on the `scheduler` topic
    For every input that matters the service writes a `SchedulerObserved` record: the input's compact
    facts, where it was read (topic, partition, offset), the observations derived from it and how many
    decision events it caused. The core is deterministic, so re-applying the records in `seq` order
    re-creates the same state and the very same decision events (ids `uuid5(run id, event number)`,
    `ts_ms` = time of the observation). Records are small and one partition keeps them in order; the
    decisions themselves are spread over six topics and are not needed to rebuild. Inputs that change
    nothing (redeliveries, unknown resources, other runs' events, quiet clock ticks) are not journaled.

    Why a journal rather than re-reading the input topics up to offsets stored in the decisions: the
    inputs come from five topics (eight partitions) with no order across them, so offsets alone do not
    say in which order the scheduler saw them, and the order decides (which group closes a batch,
    which resource a sync waits for). The journal records that order once.

    Per polled batch of inputs:
      1. derive + handle every input in memory (the core's decisions are already applied);
      2. publish the batch's SchedulerObserved records, flush (Kafka acknowledged them);
      3. publish the decision events, flush;
      4. publish a `SchedulerCheckpoint` (counters, decision config, and every `snapshot_interval_s`
         the whole state with its sha256), then commit the input offsets.
    Decisions are thus published before their inputs are committed (at-least-once), and never before
    their journal record, so the journal always explains every published decision.

    Restart: read the run's journal from the start of `scheduler` (in bounded chunks; the core has no
    snapshot restore, so a restart replays the whole run), replay it (each record is checked: same
    observations, same number of events), then
      * inputs re-read because their offsets were not committed are skipped: the journal remembers
        the last journaled offset of every input partition;
      * records after the last checkpoint are the only ones whose decisions may be partly unpublished
        (a crash between 2 and 4): the service reads the decision topics from that record's time on
        and publishes exactly the missing events (same ids, same bytes); a copy that still raced in
        is a duplicate any consumer drops by event id;
      * a restart with different decision settings (policy, batch size, dataset, ...) is refused.
    No decision is re-emitted after a clean stop or a crash outside that window, and the rebuilt state
    equals the one before the crash (`--dump-state`, the state file, `sflow replay scheduler`).

    A poison input (an exception while handling it) is dead-lettered and the state is rebuilt from
    the journal, so the half-applied input leaves no trace. Run one instance per run id: the static
    consumer-group membership (`group.instance.id` = instance id) lets a restarted instance take over
    its partitions at once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus.config import BusConfig
from bus.consumer import EventConsumer, Received
from bus.metrics import ServiceMetrics
from bus.producer import EventProducer
from bus.replay import ReplayRange, replay
from bus.topics import topic_of
from scheduler_svc.config import SchedulerServiceConfig
from scheduler_svc.errors import ReplayError, SchedulerError
from scheduler_svc.journal import Source, Step
from scheduler_svc.metrics import SyncPauses, export
from scheduler_svc.rebuild import CheckpointCheck, diff_states, load_tasks, new_scheduler, rebuild
from scheduler_svc.tasks import Task
from schemas import events as ev

log = logging.getLogger(__name__)

INPUT_TOPICS: tuple[str, ...] = ("resources", "trajectories", "train", "weights", "control")
JOURNAL_TOPIC = "scheduler"
#: Decision events of a crashed batch were produced after its journal records; read from a little earlier.
RECONCILE_SLACK_MS = 1000


def consumer_group(config: SchedulerServiceConfig) -> str:
    """One group per run and stack: stacks that share a cluster differ in their topic prefix."""
    return f"{config.bus.topic_prefix}scheduler.{config.run_id}"


def iter_journal(
    bus: BusConfig, run_id: str, *, end_offset: int | None = None, end_ms: int | None = None, chunk: int = 20_000
) -> Iterator[Received]:
    """The run's SchedulerObserved and SchedulerCheckpoint records in journal order, read `chunk`
    messages of `scheduler` at a time (memory stays bounded however long the run)."""
    start = 0
    while end_offset is None or start < end_offset:
        stop = start + chunk if end_offset is None else min(start + chunk, end_offset)
        result = replay(bus, [JOURNAL_TOPIC], ReplayRange(start_offset=start, end_offset=stop, end_ms=end_ms))
        for topic, partition, offset, reason in result.skipped:
            log.warning("undecodable message in the journal topic", extra={
                "service": "scheduler", "topic": topic, "partition": partition, "offset": offset, "reason": reason})
        offsets = [r.offset for r in result.events] + [o for _, _, o, _ in result.skipped]
        if not offsets:
            return
        for r in result.events:
            if isinstance(r.event, ev.SchedulerObserved | ev.SchedulerCheckpoint) and r.event.run_id == run_id:
                yield r
        start = max(offsets) + 1


def read_journal(bus: BusConfig, run_id: str) -> list[Received]:
    """The whole journal of a run in memory (tests, small runs)."""
    return list(iter_journal(bus, run_id))


def first_checkpoint(bus: BusConfig, run_id: str) -> ev.SchedulerCheckpoint | None:
    return next((r.event for r in iter_journal(bus, run_id) if isinstance(r.event, ev.SchedulerCheckpoint)), None)


def dump_state(config: SchedulerServiceConfig) -> dict[str, Any]:
    """The state rebuilt from the run's journal (read only: publishes nothing)."""
    return rebuild(config, iter_journal(config.bus, config.run_id)).scheduler.state()


class SchedulerService:
    """Consume inputs, journal them, publish decisions; see the module docstring for the guarantees."""

    def __init__(self, config: SchedulerServiceConfig, tasks: Sequence[Task] | None = None) -> None:
        self.config = config
        self.tasks: Sequence[Task] = load_tasks(config) if tasks is None else tasks
        self.producer = EventProducer(config.bus, producer_id=config.instance_id)
        self.scheduler = new_scheduler(config, self.tasks)
        self._state_written_at = -math.inf
        self.batches = 0
        self.republished = 0
        self.metrics = ServiceMetrics("scheduler")
        export(self.metrics, lambda: self.scheduler)
        self.sync_pauses = SyncPauses(self.metrics)

    # ---------------------------------------------------------------------------------- start-up

    def start(self) -> None:
        """Rebuild from the journal, publish what a crash left unpublished, write a checkpoint."""
        rebuilt = rebuild(self.config, iter_journal(self.config.bus, self.config.run_id), self.tasks)
        last = rebuilt.last_checkpoint
        if last is not None and last.state and not rebuilt.tail:
            differences = diff_states(json.loads(last.state), rebuilt.scheduler.state())
            if differences:
                log.error("rebuilt state differs from the recorded one (see `sflow replay scheduler`)",
                          extra={"service": "scheduler", "differences": "; ".join(differences[:5])})
        self.scheduler = rebuilt.scheduler
        self.republished = self._reconcile(rebuilt.tail)
        log.info("scheduler rebuilt", extra={
            "service": "scheduler", "run": self.config.run_id, "records": rebuilt.records,
            "events": self.scheduler.event_seq, "unconfirmed_records": len(rebuilt.tail),
            "republished": self.republished})
        if rebuilt.tail or rebuilt.last_checkpoint is None:
            self._checkpoint(force_state=True)
        else:
            self._write_state_file(self.scheduler.state())

    def _reconcile(self, tail: list[tuple[Received, Step]]) -> int:
        """Publishes the decision events of unconfirmed records that Kafka does not hold yet."""
        needed = [e for _, step in tail for e in step.events]
        if not needed:
            return 0
        since = min(r.timestamp_ms for r, _ in tail) - RECONCILE_SLACK_MS
        topics = sorted({topic_of(type(e)).name for e in needed})
        present = {r.event.event_id for r in replay(self.config.bus, topics, ReplayRange(start_ms=since)).events}
        missing = [e for e in needed if e.event_id not in present]
        for e in missing:
            self.producer.publish(e)
        self.producer.flush()
        return len(missing)

    # ---------------------------------------------------------------------------------- loop

    def run(self, stop: threading.Event) -> None:
        config = self.config
        server = None if config.metrics_port is None else self.metrics.serve(config.metrics_host, config.metrics_port)
        try:
            self._run(stop)
        finally:
            if server is not None:
                server.close()

    def _run(self, stop: threading.Event) -> None:
        self.start()
        membership: dict[str, Any] = {"group.instance.id": self.config.instance_id, "session.timeout.ms": 10_000}
        consumer = EventConsumer(self.config.bus, consumer_group(self.config), INPUT_TOPICS, dlq=self.producer,
                                 metrics=self.metrics, **membership)
        log.info("scheduler consuming", extra={"service": "scheduler", "run": self.config.run_id,
                                                "topics": ",".join(INPUT_TOPICS)})
        tick = self.config.tick_interval_s
        next_tick = time.monotonic() + tick
        steps: list[Step] = []  # the batch's journal records and decisions, published before its commit

        def publish_batch(_batch: list[Received]) -> None:
            nonlocal next_tick
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + tick
                self._tick(time.time(), steps)
            self._publish(steps)
            steps.clear()

        # An exception (a failed publish or recovery) leaves the loop without committing or closing the
        # consumer: closing commits offsets, and inputs whose decisions may be unpublished must be read
        # again after the restart.
        consumer.run(lambda r: self._consume(consumer, r, steps), stop,
                     lambda: max(0.01, min(tick, next_tick - time.monotonic())),
                     on_batch=publish_batch, on_error="raise")
        consumer.close()
        self._checkpoint(force_state=True)
        self.producer.close()

    def _consume(self, consumer: EventConsumer, r: Received, steps: list[Step]) -> None:
        source = Source(r.topic.removeprefix(self.config.bus.topic_prefix), r.partition, r.offset)
        if self.scheduler.seen(source):
            return  # journaled before a restart; its decisions are out (the loop marks it processed)
        try:
            facts = self.scheduler.input_of(r.event)
        except SchedulerError as e:
            consumer.dead_letter(r, f"unusable input: {e}")
            return
        if facts is not None:
            try:
                step = self.scheduler.observe(facts, source, r.event.ts_ms)
            except Exception as e:  # a poison input: nothing of it may stay in the state
                log.exception("input failed", extra={"service": "scheduler", "topic": source.topic,
                                                     "offset": source.offset})
                self._publish(steps)
                steps.clear()
                consumer.dead_letter(r, f"scheduler failed on it: {type(e).__name__}: {e}")
                self._recover()
                return
            if step is not None:
                steps.append(step)

    def _tick(self, t: float, steps: list[Step]) -> None:
        if self.scheduler.should_tick(t):
            step = self.scheduler.observe(self.scheduler.tick_input(t))
            if step is not None:
                steps.append(step)

    def _recover(self) -> None:
        rebuilt = rebuild(self.config, iter_journal(self.config.bus, self.config.run_id), self.tasks)
        if rebuilt.tail:
            raise ReplayError("journal has unconfirmed records while running")  # pragma: no cover
        self.scheduler = rebuilt.scheduler

    def _publish(self, steps: Sequence[Step]) -> None:
        if not steps:
            return
        for step in steps:
            self.producer.publish(step.record)
        self.producer.flush()
        for step in steps:
            for e in step.events:
                self.producer.publish(e)
        self.producer.flush()
        self.sync_pauses.saw(e for step in steps for e in step.events)
        self._checkpoint()
        self.batches += 1

    def _checkpoint(self, force_state: bool = False) -> None:
        now = time.monotonic()
        with_state = force_state or now - self._state_written_at >= self.config.snapshot_interval_s
        checkpoint = self.scheduler.checkpoint(with_state=with_state)
        if with_state:  # first: whoever sees the checkpoint finds the file up to date
            self._state_written_at = now
            self._write_state_file(json.loads(checkpoint.state))
        self.producer.publish_sync(checkpoint)

    def _write_state_file(self, state: dict[str, Any]) -> None:
        path = self.config.state_file
        if path is None:
            return
        write_json_atomically(path, state)


def write_json_atomically(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- replay


@dataclass
class ReplayReport:
    """What `sflow replay scheduler` found."""

    run_id: str
    records: int
    checks: list[CheckpointCheck]
    state: dict[str, Any]

    @property
    def ok(self) -> bool:
        return all(c.matches for c in self.checks)


def replay_scheduler(
    bus: BusConfig,
    run_id: str,
    *,
    start: int | None = None,
    end: int | None = None,
    by_time: bool = False,
    dataset: Path | None = None,
) -> ReplayReport:
    """Rebuilds run `run_id` from its journal up to `end` and compares every recorded state whose
    checkpoint lies in [start, end) (offsets of `scheduler`, or ms timestamps with `by_time`).

    The state is always rebuilt from the first journal record: the core has no snapshot restore, and
    event sourcing means replaying the whole log. The decision config comes from the journal itself.
    """
    checkpoint = first_checkpoint(bus, run_id)
    if checkpoint is None:
        raise ReplayError(f"no checkpoint of run {run_id!r} on {bus.topic(JOURNAL_TOPIC)}")
    recorded = json.loads(checkpoint.config)
    overrides: dict[str, Any] = {"bus": bus}
    if dataset is not None:
        overrides["dataset"] = dataset
    config = SchedulerServiceConfig.from_decision_config(recorded, **overrides)

    def in_range(r: Received) -> bool:
        position = r.timestamp_ms if by_time else r.offset
        return (start is None or position >= start) and (end is None or position < end)

    end_ms = None if end is None or not by_time else end - 1  # ReplayRange.end_ms is inclusive
    entries = iter_journal(bus, run_id, end_offset=None if by_time else end, end_ms=end_ms)
    rebuilt = rebuild(config, entries, verify=in_range)
    return ReplayReport(run_id, rebuilt.records, rebuilt.checks, rebuilt.scheduler.state())
