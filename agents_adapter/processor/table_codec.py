"""The processor's table entries and the records of its `<app>-groups` topic: keys, values, and their bytes.

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
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from agents_adapter.errors import AdapterError
from agents_adapter.processor.group_tracker import GroupTracker
from schemas.events import BatchReady

_KEY_HEAD = struct.Struct(">cHH")
_SEQ = struct.Struct(">I")
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


def group_value(tracker: GroupTracker, group_id: str) -> bytes | None:
    state = tracker.group_state(group_id)
    if state is None:
        return None
    return json.dumps({"size": state.size, "task": state.task_id, "members": state.members}).encode()


def restore_group(tracker: GroupTracker, group_id: str, value: bytes) -> list[BatchReady]:
    data = json.loads(value)
    batches = [tracker.expect(group_id, data["size"], data["task"])] if data["size"] else []
    batches += [tracker.add_member(group_id, tid, data["task"], lo, hi, ts) for tid, lo, hi, ts in data["members"]]
    return [b for b in batches if b is not None]


_TS = struct.Struct("<q")


def fired_value(ts_ms: int) -> bytes:
    """The value of a fired group's marker (`FIRED` key): when its BatchReady fired."""
    return _TS.pack(ts_ms)


def fired_ts(value: bytes) -> int:
    return int(_TS.unpack(value)[0])
