"""Stage 2 of the processor, keyed by group: group records in, one BatchReady per complete task group out.

A group's sessions live on different partitions of stage 1, hence this second, group-keyed stage: it
reads the member records stage 1 sends (and the group sizes forwarded from TaskDispatched) and counts
samples per group in a `GroupTracker` backed by `table` (the Faust table `groups` in the worker, any
mutable mapping in a test). n comes from the task (`GroupTracker.expect`), else from SessionStarted
metadata, else from `group_size`. A fired group's BatchReady is published (and acknowledged) before
its fired marker replaces its pending entry.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from agents_adapter.processor.config import ProcessorConfig
from agents_adapter.processor.group_tracker import GroupTracker
from agents_adapter.processor.session_stage import Publish, Table, Writes, flush_pending
from agents_adapter.processor.table_codec import (
    FIRED,
    GROUP,
    GroupRecord,
    TableKey,
    fired_ts,
    fired_value,
    group_value,
    restore_group,
)
from schemas.events import BatchReady, now_ms


@dataclass
class _Groups:
    """Stage-2 state of one groups partition."""

    stored: set[str] = field(default_factory=set)
    fired: dict[str, int] = field(default_factory=dict)
    pending: Writes = field(default_factory=list)
    pending_batches: list[BatchReady] = field(default_factory=list)
    last_cleanup_ms: int = 0


class GroupStage:
    """Group records -> BatchReady for the groups partitions of one worker (see the module doc)."""

    def __init__(self, config: ProcessorConfig, table: Table, publish: Publish) -> None:
        self.config = config
        self.table = table
        self.publish = publish
        self.tracker = GroupTracker(config.group_size, config.producer)
        self._groups: dict[int, _Groups] = defaultdict(_Groups)

    async def on_record(self, p: int, record: GroupRecord) -> None:
        """Handles one record of groups partition `p`."""
        state = self._groups[p]
        table, tracker, gid = self.table, self.tracker, record.group_id
        flush_pending(table, state.pending)
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
            value = group_value(tracker, gid)
            if value is not None:
                table[TableKey(GROUP, p, gid).to_bytes()] = value
                state.stored.add(gid)
        self._cleanup_groups(p, state)

    async def _fired(self, p: int, state: _Groups, batch: BatchReady) -> None:
        """Publishes a BatchReady, then replaces the group's entry by its fired marker."""
        await self.publish(batch)
        gid = batch.group_id
        self.table[TableKey(FIRED, p, gid).to_bytes()] = fired_value(batch.ts_ms)  # marker first
        state.fired[gid] = batch.ts_ms
        if gid in state.stored:
            del self.table[TableKey(GROUP, p, gid).to_bytes()]
            state.stored.discard(gid)

    def _cleanup_groups(self, p: int, state: _Groups) -> None:
        now = now_ms()
        if now - state.last_cleanup_ms < 60_000:
            return
        state.last_cleanup_ms = now
        horizon = now - self.config.closed_retention_ms
        for gid in [g for g, ts in state.fired.items() if ts < horizon]:
            del self.table[TableKey(FIRED, p, gid).to_bytes()]
            del state.fired[gid]
        self.tracker.forget(horizon)

    def rebuild(self, resync: bool) -> None:
        """The tracker rebuilt from the table; groups complete in it fire in their partition's next record.
        `resync` also re-puts every entry then (after a failed write)."""
        self.tracker = GroupTracker(self.config.group_size, self.config.producer)
        self._groups = defaultdict(_Groups)
        for raw_key, value in self.table.items():
            key = TableKey.from_bytes(raw_key)
            state = self._groups[key.partition]
            if resync:
                state.pending.append((raw_key, value))
            if key.kind == FIRED:
                ts = fired_ts(value)
                self.tracker.restore_done(key.entity, ts)
                state.fired[key.entity] = ts
            elif key.kind == GROUP and self.tracker.is_done(key.entity):  # fired: its entry outlived a crash
                state.pending.append((raw_key, None))
            elif key.kind == GROUP:
                state.pending_batches += restore_group(self.tracker, key.entity, value)
                state.stored.add(key.entity)
