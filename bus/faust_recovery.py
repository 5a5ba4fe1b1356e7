"""Workarounds for faust-streaming 0.15.3 on aiokafka 0.14 that a Faust app losing no input needs.

Found by the trajectory processor's SIGKILL tests; any Faust app of this project can use them.

Where each partition starts (`InputGuard.seek_to_group_start`, after every recovery)
    Faust seeks only the partitions that have a committed offset above 0; one with messages but no
    commit was read from about its end, skipping what was produced before the worker's fetcher
    started (the lost sessions of the SIGKILL tests: their calls were never read, and the skipped
    offsets left an ack gap that kept the partition from ever being committed). So after every
    recovery each partition of the guarded topics is sought to where the group resumes it
    (`bus.consumer.group_start_offsets`: committed, else earliest).

Gaps are refused (`InputGuard.refuse_gap`, installed as the consumer's gap handler)
    Faust fills a jump in a partition's offsets as if acknowledged (meant for compacted topics), which
    would let a commit pass inputs never processed. Topics without gaps (not compacted, no transaction
    markers) are instead sought back over the skipped offsets.

Inputs in offset order (`InputGuard.admitted`, the agents' streams)
    After a seek (recovery, a refused gap) the fetcher can still deliver messages fetched before it, so a
    later input could overtake an earlier one, and Faust, which marks a seek's offset as read, then drops
    the earlier one when it is fetched again. An agent therefore takes each guarded partition's inputs
    strictly in offset order: one read again is skipped, one ahead of the next offset is neither processed
    nor acknowledged and the partition is sought back to that offset. Applying a session's inputs in their
    partition order keeps its trajectory identical (call order included) however the worker was killed.

A commit never passes an input (`InputGuard.committable_offset`, installed as the consumer's `_new_offset`)
    Faust commits the run of acked offsets that starts at most one above the committed offset, and marks
    the offset it seeks to as read: after a seek, an input at the seek offset that a later one overtook is
    dropped and then committed past (lost). The guard refuses any commit while the partition's next offset
    is unacknowledged; the watchdog below re-reads such an offset.

Stalled partitions (`InputGuard.unstall`, from a timer)
    A guard: a partition with messages (highwater read from the broker) past the next offset its agent
    has not seen (`InputGuard.seen`), and no progress for `stall_timeout_s`, is sought back to that
    offset and logged. So is a partition whose next offset to commit stayed unacknowledged behind
    acknowledged ones for `stall_timeout_s`. Re-reading must be safe for the app (the trajectory core
    ignores inputs it has).

The changelog is the state (`drop_local_tables`, `BufferHandoff`)
    Faust writes a table entry to RocksDB at once and to the changelog asynchronously; a worker killed
    in between would restart with local entries the changelog lacks. An app whose re-read inputs redo
    their writes deterministically starts from the changelogs alone (its local table files dropped).
    The commit's flush does not cover a write still in Faust's producer buffer or in its hand-off to the
    Kafka client, so a handler waits until its writes are in the client (`BufferHandoff.wait_handed`)
    before its input can be acked and committed.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Any, Final

from bus.config import BusConfig
from bus.consumer import group_start_offsets
from bus.errors import BusError

log = logging.getLogger("sflow.bus.faust")
_NEXT, _READ_AGAIN, _AHEAD = "next", "read again", "ahead"  # what `admitted` does with an input
_LOG: Final = {"service": "faust"}


class _ReadOffsets(dict[Any, Any]):
    """Faust's consumer `_read_offset` (partition -> the offset it read last), held at a hole being read again.

    Faust accepts a fetched message only at or above that offset. After a seek back to a hole, messages
    fetched before the seek still arrive and raise it, so the hole, fetched again, would be dropped (seen:
    a worker seeking back to one offset for ever). While a hole is open the map answers at most the hole;
    Faust reading the hole itself closes it."""

    def __init__(self, current: dict[Any, Any], holes: dict[Any, int]) -> None:
        super().__init__(current)
        self.holes = holes

    def __getitem__(self, tp: Any) -> Any:
        stored, hole = super().get(tp), self.holes.get(tp)
        if hole is None:
            return stored
        return hole if stored is None else min(stored, hole)

    def __setitem__(self, tp: Any, offset: Any) -> None:
        if offset is not None and self.holes.get(tp) == offset:
            del self.holes[tp]
        super().__setitem__(tp, offset)


class InputGuard:
    """Start offsets, gap refusal and the stall watchdog for the partitions of `topics` (full names)."""

    def __init__(self, app: Any, bus: BusConfig, group_id: str, topics: Collection[str],
                 stall_timeout_s: float) -> None:
        self.app, self.bus, self.group_id = app, bus, group_id
        self.topics = set(topics)
        self.stall_timeout_s = stall_timeout_s
        self._seek_tasks: set[asyncio.Task[None]] = set()
        self._progress: dict[tuple[str, int], tuple[int, float]] = {}  # input tp -> next offset, when it moved
        self._start: dict[Any, int] = {}  # tp -> where the group resumed it at the last recovery
        self._expected: dict[tuple[str, int], int] = {}  # guarded partition -> next offset to process
        self._seeking: set[tuple[str, int]] = set()  # partitions with a seek back on its way
        self._held_since: dict[Any, float] = {}  # tp -> since when its next offset is unacked behind acked ones
        self._holes: dict[Any, int] = {}  # partition -> an offset sought back to, not read again yet
        app.consumer._read_offset = _ReadOffsets(app.consumer._read_offset, self._holes)
        app.consumer._add_gap = self.refuse_gap  # module doc: "Gaps are refused"
        self._faust_new_offset = app.consumer._new_offset
        app.consumer._new_offset = self.committable_offset  # module doc: "A commit never passes an input"

    async def admitted(self, stream: Any) -> AsyncIterator[Any]:
        """The Faust events of `stream` that its agent must process: each guarded partition's inputs in
        offset order, each once per recovery (module doc: "Inputs in offset order"). An event is
        acknowledged only once the agent's body for it returned; one that arrived ahead of a missing offset
        is never acknowledged (the commit cannot pass it) and is read again, in order, after a seek back."""
        manual = stream.noack()
        async for fevent in manual.events():
            verdict = self._admit(fevent.message)
            if verdict == _AHEAD:
                continue
            if verdict == _NEXT:
                yield fevent
            await manual.ack(fevent)

    def _admit(self, message: Any) -> str:
        key = (message.topic, message.partition)
        if message.topic not in self.topics:
            return _NEXT
        expected = self._expected.get(key)
        if expected is None or message.offset == expected:
            self._expected[key] = message.offset + 1
            self._progress[key] = (message.offset + 1, time.monotonic())
            return _NEXT
        if message.offset < expected:
            return _READ_AGAIN
        self._seek_back(message.tp, key, f"offset {message.offset} arrived before {expected}")
        return _AHEAD

    def _seek_back(self, tp: Any, key: tuple[str, int], why: str, force: bool = False) -> None:
        """Seeks the partition back to its next offset to process: once at a time per partition, and not
        while the hole of an earlier seek is still on its way (unless `force`: the watchdog)."""
        if key in self._seeking or (tp in self._holes and not force):
            return
        self._seeking.add(key)
        log.warning("%s[%d]: %s; reading again from %d", tp.topic, tp.partition, why, self._expected[key],
                    extra=_LOG)

        async def seek() -> None:
            try:
                await self._seek_to_hole(tp, self._expected[key])
            finally:
                self._seeking.discard(key)

        task = asyncio.get_running_loop().create_task(seek())
        self._seek_tasks.add(task)
        task.add_done_callback(self._seek_tasks.discard)

    async def _seek_to_hole(self, tp: Any, offset: int) -> None:
        await self.app.consumer.seek(tp, offset)
        self._holes[tp] = offset  # after the seek: Faust's seek writes the read offset (`_ReadOffsets`)

    async def seek_to_group_start(self) -> None:
        """Seeks each assigned partition of the guarded topics to where the group resumes it."""
        consumer = self.app.consumer
        tps = {(tp.topic, tp.partition): tp for tp in consumer.assignment() if tp.topic in self.topics}
        starts = await asyncio.to_thread(group_start_offsets, self.bus, self.group_id, sorted(tps))
        now = time.monotonic()
        for key, offset in starts.items():
            await self._seek_to_hole(tps[key], offset)
            self._progress[key] = (offset, now)
            self._start[tps[key]] = offset
            self._expected[key] = offset

    def next_to_commit(self, tp: Any) -> int | None:
        """The partition's first offset not yet committed: Faust's committed offset, else the group start."""
        committed = self.app.consumer._committed_offset.get(tp)
        return committed if committed is not None else self._start.get(tp)

    def committable_offset(self, tp: Any) -> int | None:
        """Faust's `_new_offset`, refusing to commit while the partition's next offset is not acknowledged.

        Faust takes the run of consecutive acked offsets from the smallest one and lets it start one above
        the committed offset (`min(acked) - committed > 1`), while a Kafka committed offset is the next one
        to process: an input left unread at exactly that offset is committed past. And Faust marks the
        offset it seeks to as already read, so after a seek (recovery, a refused gap) an input at the seek
        offset is dropped when a later one arrives first (the SIGKILL test's lost sessions, whose
        SessionEnded sat at the offset sought to). `unstall` re-reads such an input."""
        if tp.topic not in self.topics:
            return self._faust_new_offset(tp)
        acked = self.app.consumer._acked.get(tp)
        floor = self.next_to_commit(tp)
        if acked and floor is not None and min(acked) > floor:
            self._held_since.setdefault(tp, time.monotonic())
            return None
        self._held_since.pop(tp, None)
        new_offset: int | None = self._faust_new_offset(tp)
        return new_offset

    async def refuse_gap(self, tp: Any, offset_from: int, offset_to: int) -> None:
        """Faust counts a jump in a partition's offsets as acknowledged, so its next commit would pass
        inputs never processed. Our topics have no gaps (not compacted, no transaction markers): a jump
        means the fetcher skipped messages, so they stay unacknowledged and the partition is sought back to
        its next offset to process (`admitted` drops whatever arrives ahead of it meanwhile)."""
        key = (tp.topic, tp.partition)
        self._expected.setdefault(key, offset_from)
        self._seek_back(tp, key, f"offsets {offset_from}-{offset_to - 1} skipped by the fetcher")

    async def unstall(self) -> None:
        """Seeks each stalled guarded partition back to its next unprocessed offset (module doc)."""
        consumer, now = self.app.consumer, time.monotonic()
        tps = sorted(tp for tp in consumer.assignment() if tp.topic in self.topics)
        if not tps:
            return
        await self._reread_held(tps, now)
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
            if high <= next_offset or now - moved < self.stall_timeout_s:
                continue
            log.warning("input %s[%d] stalled at offset %d (highwater %d) for %.0f s: seeking back to it",
                        tp.topic, tp.partition, next_offset, high, now - moved, extra=_LOG)
            await self._seek_to_hole(tp, next_offset)
            self._progress[(tp.topic, tp.partition)] = (next_offset, now)

    def lag(self) -> dict[str, int]:
        """Messages not processed yet per guarded topic (without the prefix), for `bus.metrics`: the
        client's local highwater minus the next offset to process. Read from the metrics thread, so it
        uses local values only (no broker call, no await)."""
        consumer, out = self.app.consumer, dict[str, int]()
        for tp in sorted(consumer.assignment()):
            if tp.topic not in self.topics:
                continue
            high = consumer.highwater(tp)
            start = self._start.get(tp, high)
            next_offset = self._progress.get((tp.topic, tp.partition), (start, 0.0))[0]
            topic = tp.topic.removeprefix(self.bus.topic_prefix)
            known = high is not None and next_offset is not None
            out[topic] = out.get(topic, 0) + (max(0, high - next_offset) if known else 0)
        return out

    async def _reread_held(self, tps: list[Any], now: float) -> None:
        """A partition whose next offset stays unacknowledged behind acknowledged ones (a dropped input,
        `committable_offset`) for `stall_timeout_s` is sought back to that offset."""
        for tp in tps:
            since, floor = self._held_since.get(tp), self.next_to_commit(tp)
            if since is None or floor is None or now - since < self.stall_timeout_s:
                continue
            log.warning("input %s[%d]: offset %d was never processed while later ones were; seeking back to it",
                        tp.topic, tp.partition, floor, extra=_LOG)
            await self._seek_to_hole(tp, floor)
            self._held_since[tp] = now


def drop_local_tables(app: Any) -> None:
    """Starts a worker from the changelogs alone (module doc: "The changelog is the state")."""
    tables = Path(app.conf.tabledir)
    if tables.is_dir():
        shutil.rmtree(tables)
        log.info("dropped the local table files under %s: recovering from the changelogs", tables, extra=_LOG)


class BufferHandoff:
    """Counts the messages Faust's producer buffer took (table changelog writes) and those it handed to the
    Kafka client, so a handler can wait until its writes are in the client before its input is acked.

    Why not the buffer's size: the buffer's sender takes a message off its queue *before* handing it to
    the client, so an empty queue can still hold a write in the hand-off, which the commit's flush
    (`Producer.flush`: the buffer's flush, which also gives up after 0.1 s without a send, then the
    client's) does not cover. A worker killed after that commit lost the write while its input's
    offset was committed: a session missing a delta waited for it forever (the SIGKILL test's lost
    session, measured: a few such hand-offs in flight per run when `buffer.size` was the test).
    Once a write is in the client, the client's flush before the commit covers it.

    Install it before the app starts: the buffer's sender binds `_send_pending` when it starts.
    """

    def __init__(self, app: Any) -> None:
        if app.conf.producer_threaded:
            raise BusError("BufferHandoff needs producer_threaded=False (the threaded buffer has its own queue)")
        buffer = app.producer.buffer
        self.taken = 0
        self.handed = 0
        put, send = buffer.put, buffer._send_pending

        def counted_put(fut: Any) -> None:
            self.taken += 1
            put(fut)

        async def counted_send(fut: Any) -> None:
            try:
                await send(fut)
            finally:  # a failed send crashes the producer; nothing is left to wait for
                self.handed += 1

        buffer.put, buffer._send_pending = counted_put, counted_send

    @property
    def in_flight(self) -> int:
        return self.taken - self.handed

    async def wait_handed(self, timeout_s: float = 60.0) -> None:
        """Returns once every message taken so far is in the Kafka client; raises BusError after
        `timeout_s` (the producer is stuck: the caller stops the worker rather than ack the input)."""
        target, deadline = self.taken, time.monotonic() + timeout_s
        while self.handed < target:
            if time.monotonic() > deadline:
                raise BusError(f"{target - self.handed} changelog writes not handed to Kafka after {timeout_s:.0f} s")
            await asyncio.sleep(0.001)
