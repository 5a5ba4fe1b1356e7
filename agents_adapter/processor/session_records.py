"""What the trajectory core persists of a session, and the ids of its outputs (`assembler` says why).

Event ids are uuid5 of the session (or group) id, so every copy of an output is the same fact;
`CloseMarker` is a closed session's tombstone, `SessionDelta` one change of an open session, both
written by the Faust shell as table entries and read back by a recovery.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from dataclasses import dataclass
from typing import Final

from agents_adapter.errors import AdapterError, DeltaError
from agents_adapter.processor.tree_delta import TreeDelta
from schemas.events import SessionEnded, decode_event, encode_event

NAMESPACE: Final = uuid.UUID("6f1c2a7e-5b0e-5d1a-9c4e-53a3d1f10f10")


def trajectory_event_id(session_id: str) -> str:
    """Event id of a session's trajectory: the same for every copy of it."""
    return uuid.uuid5(NAMESPACE, f"Trajectory/{session_id}").hex


def call_digest(call_id: str) -> int:
    """64-bit digest of a call id: what a closed session keeps to recognise its own calls read again."""
    return int.from_bytes(hashlib.blake2b(call_id.encode(), digest_size=8).digest(), "little")


_MARKER_HEAD = struct.Struct("<qI")
_DIGEST = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class CloseMarker:
    """A closed session's tombstone: its close time and the digests of the calls in its trajectory.

    Wire format (`to_bytes`, little-endian): i64 ts_ms, u32 n, n x u64 digests. An 8-byte value (the
    format before digests) reads as `call_digests=None`: such a session cannot tell its own
    redelivered calls from late ones, and drops both as before.
    """

    ts_ms: int
    call_digests: frozenset[int] | None

    @classmethod
    def of(cls, ts_ms: int, call_ids: tuple[str, ...]) -> CloseMarker:
        return cls(ts_ms, frozenset(call_digest(c) for c in call_ids))

    def to_bytes(self) -> bytes:
        digests = sorted(self.call_digests or ())
        return _MARKER_HEAD.pack(self.ts_ms, len(digests)) + b"".join(_DIGEST.pack(d) for d in digests)

    @classmethod
    def from_bytes(cls, data: bytes) -> CloseMarker:
        if len(data) == 8:
            return cls(struct.unpack("<q", data)[0], None)
        try:
            ts_ms, n = _MARKER_HEAD.unpack_from(data, 0)
            if len(data) != _MARKER_HEAD.size + n * _DIGEST.size:
                raise DeltaError(f"close marker of {len(data)} bytes does not hold {n} digests")
            digests = frozenset(_DIGEST.unpack_from(data, _MARKER_HEAD.size + i * _DIGEST.size)[0] for i in range(n))
        except struct.error as e:
            raise DeltaError(f"undecodable close marker ({len(data)} bytes): {e}") from e
        return cls(ts_ms, digests)


_SD_MAGIC: Final = b"SFSD"
_SD_FORMAT: Final = 1
_SD_HEADER = struct.Struct("<4sBIqI")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")


@dataclass(frozen=True, slots=True, eq=False)
class SessionDelta:
    """One change of a session's state, for the processor's table; `restore` replays it.

    The header fields (ids, group size, newest input ts, pending SessionEnded) are the session's
    current values, not differences: they are a few dozen bytes. `tree` is the prefix-tree delta.

    Wire format (`to_bytes`, little-endian): magic b"SFSD", u8 format (1), u32 seq, i64 last_ts_ms,
    u32 group_size (0 = unknown), then session_id, agent_id, task_id, group_id each as u16 length +
    utf-8, then u32 length + the pending SessionEnded in Avro single-object encoding (length 0 =
    none), then u32 length + the tree delta (`TreeDelta.to_bytes`).
    """

    session_id: str
    seq: int
    agent_id: str
    task_id: str
    group_id: str
    group_size: int
    last_ts_ms: int
    ended: SessionEnded | None
    tree: TreeDelta

    def to_bytes(self) -> bytes:
        try:
            parts = [_SD_HEADER.pack(_SD_MAGIC, _SD_FORMAT, self.seq, self.last_ts_ms, self.group_size)]
            for text in (self.session_id, self.agent_id, self.task_id, self.group_id):
                raw = text.encode()
                parts += [_U16.pack(len(raw)), raw]
            for blob in (encode_event(self.ended) if self.ended else b"", self.tree.to_bytes()):
                parts += [_U32.pack(len(blob)), blob]
        except struct.error as e:
            raise DeltaError(f"session {self.session_id!r}: delta field out of range: {e}") from e
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionDelta:
        try:
            magic, fmt, seq, last_ts_ms, group_size = _SD_HEADER.unpack_from(data, 0)
            if magic != _SD_MAGIC or fmt != _SD_FORMAT:
                raise DeltaError(f"not a session delta: magic {magic!r}, format {fmt}")
            pos = _SD_HEADER.size
            texts = []
            for _ in range(4):
                (n,) = _U16.unpack_from(data, pos)
                texts.append(bytes(data[pos + 2:pos + 2 + n]).decode())
                pos += 2 + n
            blobs = []
            for _ in range(2):
                (n,) = _U32.unpack_from(data, pos)
                blobs.append(bytes(data[pos + 4:pos + 4 + n]))
                pos += 4 + n
            if pos != len(data):
                raise DeltaError(f"session delta length mismatch: parsed {pos} of {len(data)} bytes")
            ended = decode_event(blobs[0]) if blobs[0] else None
        except (struct.error, UnicodeDecodeError) as e:
            raise DeltaError(f"undecodable session delta ({len(data)} bytes): {e}") from e
        except Exception as e:
            if isinstance(e, AdapterError):
                raise
            raise DeltaError(f"session delta holds an undecodable SessionEnded: {e}") from e
        if ended is not None and not isinstance(ended, SessionEnded):
            raise DeltaError(f"session delta holds a {ended.event_type}, not a SessionEnded")
        session_id, agent_id, task_id, group_id = texts
        return cls(session_id, seq, agent_id, task_id, group_id, group_size, last_ts_ms, ended,
                   TreeDelta.from_bytes(blobs[1]))
