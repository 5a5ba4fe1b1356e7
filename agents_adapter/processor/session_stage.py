"""Stage 1 of the processor, keyed by session: inputs of one partition in, trajectories and group records out.

Each input partition has its own `TrajectoryAssembler`; `table` (the Faust table `sessions` in the
worker, any mutable mapping in a test) holds its open sessions as immutable entries (`table_codec`).
A session closing publishes its Trajectory, then a member record for stage 2, through `publish`
(which returns once Kafka acknowledged it), and only then changes the table, in the order that makes
a crash at any point safe: the deltas of the input, the close marker, the deletes of the deltas.

A tick (a MetricSample named `TICK_METRIC` on the ticks topic) runs the TTL of its partition: Faust
tables can be changed only while processing an event of the key's partition, so the timer sends
each partition a tick instead of expiring sessions from the timer itself.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from agents_adapter.errors import AdapterError, RejectedCallError
from agents_adapter.processor.assembler import Emitted, TrajectoryAssembler
from agents_adapter.processor.config import ProcessorConfig
from agents_adapter.processor.session_records import CloseMarker, SessionDelta
from agents_adapter.processor.table_codec import CLOSED, DELTA, GroupRecord, TableKey
from schemas.events import BatchReady, Event, LLMCall, MetricSample, SessionEnded, SessionStarted, Trajectory

log = logging.getLogger("sflow.agents_adapter.processor")
_LOG: Final = {"service": "trajectory-processor"}

TICK_METRIC: Final = "trajectory_processor.tick"

Table: TypeAlias = MutableMapping[bytes, bytes]
Writes: TypeAlias = list[tuple[bytes, bytes | None]]  # table writes decided outside an event; None deletes
Output: TypeAlias = Trajectory | BatchReady | GroupRecord
Publish: TypeAlias = Callable[[Output], Awaitable[None]]  # returns once Kafka acknowledged the output


def flush_pending(table: Table, pending: Writes) -> None:
    """Table writes decided outside an event (recovery), done in the first event of their partition."""
    for key, value in pending:
        if value is None:
            del table[key]
        else:
            table[key] = value
    pending.clear()


@dataclass
class _Partition:
    """Stage-1 state of one input partition: the assembler and what the stage knows of its table."""

    assembler: TrajectoryAssembler
    stored: dict[str, int] = field(default_factory=dict)  # open session -> deltas in the table (seq 0..n-1)
    group_sizes: dict[str, int] = field(default_factory=dict)
    closed: dict[str, int] = field(default_factory=dict)  # tombstones in the table: session -> close ts
    pending: Writes = field(default_factory=list)  # writes for the next event


class SessionStage:
    """Sessions -> trajectories for the partitions of one worker (see the module doc)."""

    def __init__(self, config: ProcessorConfig, table: Table, publish: Publish, ticks_topic: str) -> None:
        self.config = config
        self.table = table
        self.publish = publish
        self.ticks_topic = ticks_topic
        self._partitions: dict[int, _Partition] = {}

    async def on_input(self, p: int, topic: str, event: Event) -> str | None:
        """Handles one input of partition `p`; returns why it must be dead-lettered, or None."""
        part = self._partition(p)
        flush_pending(self.table, part.pending)
        is_tick_topic = topic == self.ticks_topic
        if is_tick_topic and isinstance(event, MetricSample) and event.name == TICK_METRIC:
            emitted = part.assembler.expire(event.ts_ms, self.config.ttl_ms)
            self._forget_tombstones(p, part, event.ts_ms - self.config.closed_retention_ms)
        elif not is_tick_topic and isinstance(event, (LLMCall, SessionStarted, SessionEnded)):
            try:
                emitted = part.assembler.on_event(event)
            except RejectedCallError as e:
                return f"rejected call: {e}"
        else:
            return f"unexpected {event.event_type} on {topic}"
        await self._apply(p, part, emitted)
        return None

    async def _apply(self, p: int, part: _Partition, emitted: Emitted) -> None:
        """Outputs of one input, in the order that makes a crash at any point safe (module doc)."""
        closing = set(emitted.closed_sessions)
        for delta in emitted.deltas:
            if delta.group_size:
                part.group_sizes[delta.session_id] = delta.group_size
        for trajectory in emitted.trajectories:
            await self.publish(trajectory)
            size = part.group_sizes.get(trajectory.session_id, 0)
            if trajectory.group_id:
                await self.publish(GroupRecord(
                    "member", trajectory.group_id, trajectory.task_id, size, trajectory.trajectory_id,
                    trajectory.min_version, trajectory.max_version, trajectory.ts_ms))
        table = self.table
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

    def _forget_tombstones(self, p: int, part: _Partition, horizon_ms: int) -> None:
        for sid in [s for s, ts in part.closed.items() if ts < horizon_ms]:
            del self.table[TableKey(CLOSED, p, sid).to_bytes()]
            del part.closed[sid]

    def _partition(self, p: int) -> _Partition:
        part = self._partitions.get(p)
        if part is None:
            part = self._partitions[p] = _Partition(TrajectoryAssembler(self.config.assembler_config()))
        return part

    def rebuild(self, resync: bool) -> None:
        """The assemblers of every partition in the table, rebuilt from its entries. `resync` also re-puts
        every entry in the partition's next event (after a failed write, which may be in RocksDB but not
        in the changelog); the deltas of a session that has a close marker are deleted again."""
        deltas: dict[tuple[int, str], list[tuple[int, bytes]]] = defaultdict(list)
        tombstones: list[tuple[TableKey, CloseMarker]] = []
        raw_items: list[tuple[bytes, bytes]] = []
        for raw_key, value in self.table.items():
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
        restored = sum(self._restore_session(p, sid, entries) for (p, sid), entries in sorted(deltas.items()))
        deleting = {key for part in self._partitions.values() for key, value in part.pending if value is None}
        for raw_key, value in raw_items:
            if raw_key not in deleting:
                self._partition(TableKey.from_bytes(raw_key).partition).pending.append((raw_key, value))
        log.info("recovered %d open sessions, %d closed markers%s", restored, len(tombstones),
                 f", re-putting {len(raw_items)} entries" if resync else "", extra=_LOG)

    def _restore_session(self, p: int, sid: str, entries: list[tuple[int, bytes]]) -> bool:
        """Replays one session's table entries into its partition's assembler; whether it is open."""
        part = self._partition(p)
        entries.sort()
        if sid in part.closed:  # closed, but the deletes did not reach the changelog: delete again
            part.pending += [(TableKey(DELTA, p, sid, seq).to_bytes(), None) for seq, _ in entries]
            return False
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
        return sid in part.stored
