"""The trajectory processor's functional core: LLM calls and session events in, Trajectory events out.

`TrajectoryAssembler` is a pure state machine (no Kafka, no clock): the Faust shell feeds it the
`llm.calls` and `sessions` topics, persists the `SessionDelta`s it returns in its table, publishes the
Trajectory and BatchReady events, deletes the table entries of `closed_sessions`, and calls
`expire(now_ms, ttl_ms)` from a timer.

Exactly one trajectory per session
    `trajectory_id` is the session id and `event_id` is uuid5(session id): however often a session is
    closed (a replay, a processor that restarted without its table), every copy has the same id and
    the consumers' dedup keeps one. A closed session leaves a tombstone for `closed_retention_ms`
    that holds a 64-bit digest of each of its call ids (`CloseMarker`). A call arriving for it
    meanwhile is either one of its own calls read again after a restart (`stats.redelivered_calls`:
    already in the trajectory, nothing to do) or *late* (`stats.late_calls`): not in the trajectory,
    so `on_call` raises `LateCallError` and the shell dead-letters it: it is kept, never silently
    dropped, and never re-opens the session (a second, different trajectory for the same session
    would break exactly-once). With `wait_for_calls` and a right `SessionEnded.num_calls` no call is
    late. A repeated SessionEnded is counted and ignored; the first one wins.

Waiting for in-flight calls
    `llm.calls` and `sessions` are different topics, so a session's last call can be read after its
    SessionEnded. When SessionEnded says `num_calls` and fewer distinct calls are in the tree, the
    session waits (state persisted in a SessionDelta) and closes when the last call arrives, or at
    the TTL with what it has (`stats.incomplete_closes`), keeping the reported reward and status.

Determinism (replay compares bytes)
    A Trajectory depends only on the inputs: its nodes are canonical (see `prefix_tree`), `call_ids`
    follow the session's partition order, `ts_ms` is max(SessionEnded.ts_ms, newest input ts) or,
    for a TTL close, newest input ts + ttl, never the wall clock. Rebuilding from the same inputs
    with the same `producer` gives the same bytes. BatchReady: event_id uuid5(group id), ts_ms the
    newest member's, trajectory ids sorted; only `ready_groups` (a running count) depends on the
    order in which different groups complete.

Group size
    A group is ready when it holds n distinct trajectories; n comes from `GroupTracker.expect` (the
    shell may call it for each TaskDispatched), from the session's SessionStarted metadata
    (`group_size_key`, default "n_samples"), or from `AssemblerConfig.group_size`, in that order of
    precedence; the first known size of a group is kept. Trajectories for a group that already
    fired are counted (`late_samples`) and not batched again. The tracker's state is not in the
    session deltas: the shell rebuilds it by feeding the `trajectories` topic to `GroupTracker.add`.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import uuid
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from agents_adapter.errors import AdapterError, ConfigError, DeltaError, LateCallError, RejectedCallError
from agents_adapter.processor.prefix_tree import PrefixTree, TreeDelta
from schemas.events import (
    BatchReady,
    LLMCall,
    SessionEnded,
    SessionStarted,
    SessionStatus,
    Trajectory,
    decode_event,
    encode_event,
)

logger = logging.getLogger(__name__)

NAMESPACE: Final = uuid.UUID("6f1c2a7e-5b0e-5d1a-9c4e-53a3d1f10f10")
_LOG: Final = {"service": "agents_adapter"}


def trajectory_event_id(session_id: str) -> str:
    """Event id of a session's trajectory: the same for every copy of it."""
    return uuid.uuid5(NAMESPACE, f"Trajectory/{session_id}").hex


def batch_event_id(group_id: str) -> str:
    return uuid.uuid5(NAMESPACE, f"BatchReady/{group_id}").hex


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


@dataclass(frozen=True)
class AssemblerConfig:
    """Settings of the trajectory assembler.

    producer: written in the `producer` field of derived events (part of their bytes: a replay that
        compares bytes uses the same value).
    group_size: samples per task group when neither `GroupTracker.expect` nor the session metadata
        says; None = such groups never fire.
    group_size_key: SessionStarted metadata key holding the group size.
    closed_retention_ms: how long a closed session's tombstone drops late calls.
    wait_for_calls: hold a session whose SessionEnded counts more calls than arrived (see module doc).
    track_groups: count closed sessions in `tracker` and return BatchReady events; False where groups
        are counted elsewhere (the Faust processor counts them in a stage keyed by group, since the
        sessions of one group live on different partitions) or not at all (a replay).
    """

    producer: str = "trajectory-processor"
    group_size: int | None = None
    group_size_key: str = "n_samples"
    closed_retention_ms: int = 3_600_000
    wait_for_calls: bool = True
    track_groups: bool = True

    def __post_init__(self) -> None:
        if not self.producer:
            raise ConfigError(f"producer must be non-empty, got {self.producer!r}")
        if self.group_size is not None and self.group_size < 1:
            raise ConfigError(f"group_size must be >= 1 or None, got {self.group_size!r}")
        if not self.group_size_key:
            raise ConfigError(f"group_size_key must be non-empty, got {self.group_size_key!r}")
        if self.closed_retention_ms < 0:
            raise ConfigError(f"closed_retention_ms must be >= 0, got {self.closed_retention_ms!r}")


# --- session deltas ----------------------------------------------------------------------------

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


@dataclass(frozen=True, slots=True)
class Emitted:
    """What one input produced: deltas to persist, events to publish, table keys to delete."""

    deltas: tuple[SessionDelta, ...] = ()
    trajectories: tuple[Trajectory, ...] = ()
    batches: tuple[BatchReady, ...] = ()
    closed_sessions: tuple[str, ...] = ()

    def __add__(self, other: Emitted) -> Emitted:
        return Emitted(
            self.deltas + other.deltas,
            self.trajectories + other.trajectories,
            self.batches + other.batches,
            self.closed_sessions + other.closed_sessions,
        )


@dataclass
class AssemblerStats:
    """Counters the shell exports as metrics."""

    calls: int = 0
    duplicate_calls: int = 0
    redelivered_calls: int = 0  # calls of a closed session read again (already in its trajectory)
    late_calls: int = 0  # calls of a closed session that are not in its trajectory (dead-lettered)
    rejected_calls: int = 0
    duplicate_ends: int = 0
    waiting_ends: int = 0
    trajectories: int = 0
    timeouts: int = 0
    incomplete_closes: int = 0


# --- groups ------------------------------------------------------------------------------------


class _Member(NamedTuple):
    """What a group needs of a trajectory (not its tokens: groups wait for their slowest sample)."""

    min_version: int
    max_version: int
    ts_ms: int


@dataclass
class _Group:
    task_id: str = ""
    size: int | None = None
    members: dict[str, _Member] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupState:
    """A pending group: its size (None = not known yet), task and members (id, min/max version, ts)."""

    group_id: str
    size: int | None
    task_id: str
    members: tuple[tuple[str, int, int, int], ...]


class GroupTracker:
    """Counts trajectories per task group and fires one BatchReady when a group has its n samples."""

    def __init__(self, default_size: int | None = None, producer: str = "trajectory-processor") -> None:
        if default_size is not None and default_size < 1:
            raise ConfigError(f"default_size must be >= 1 or None, got {default_size!r}")
        self.default_size = default_size
        self.producer = producer
        self.ready_groups = 0
        self.late_samples = 0
        self.duplicate_samples = 0
        self._groups: dict[str, _Group] = {}
        self._done: dict[str, int] = {}

    def expect(self, group_id: str, n: int, task_id: str = "") -> BatchReady | None:
        """Sets a group's size (the first size given wins); fires if the group is already complete."""
        if n < 1:
            raise ConfigError(f"group size of {group_id!r} must be >= 1, got {n}")
        if not group_id or group_id in self._done:
            return None
        group = self._groups.setdefault(group_id, _Group())
        if group.size is None:
            group.size = n
        elif group.size != n:
            logger.warning("group size %d ignored, keeping %d", n, group.size, extra={**_LOG, "group": group_id})
        group.task_id = group.task_id or task_id
        return self._fire_if_ready(group_id, group)

    def add(self, trajectory: Trajectory) -> BatchReady | None:
        """Counts a trajectory (once per trajectory_id) and returns the group's BatchReady when complete."""
        return self.add_member(trajectory.group_id, trajectory.trajectory_id, trajectory.task_id,
                               trajectory.min_version, trajectory.max_version, trajectory.ts_ms)

    def add_member(self, group_id: str, trajectory_id: str, task_id: str, min_version: int, max_version: int,
                   ts_ms: int) -> BatchReady | None:
        """`add` for a shell that forwards only what a group needs of a trajectory (not its tokens)."""
        if not group_id:
            return None
        if group_id in self._done:
            self.late_samples += 1
            return None
        group = self._groups.setdefault(group_id, _Group())
        if trajectory_id in group.members:
            self.duplicate_samples += 1
            return None
        group.members[trajectory_id] = _Member(min_version, max_version, ts_ms)
        group.task_id = group.task_id or task_id
        return self._fire_if_ready(group_id, group)

    def group_state(self, group_id: str) -> GroupState | None:
        """What a shell persists of a group that has not fired (restored with `expect` + `add_member`)."""
        group = self._groups.get(group_id)
        if group is None:
            return None
        return GroupState(group_id, group.size, group.task_id, tuple(
            (tid, m.min_version, m.max_version, m.ts_ms) for tid, m in group.members.items()))

    def is_done(self, group_id: str) -> bool:
        return group_id in self._done

    def restore_done(self, group_id: str, ts_ms: int) -> None:
        """Remembers that a group fired (a restarted shell's persisted marker): later samples are late."""
        self._groups.pop(group_id, None)
        self._done[group_id] = ts_ms

    def pending(self, group_id: str) -> int:
        """Trajectories counted for a group that has not fired yet."""
        group = self._groups.get(group_id)
        return len(group.members) if group else 0

    def forget(self, before_ts_ms: int) -> int:
        """Drops the memory of groups that fired before a time; returns how many.

        A sample arriving for a forgotten group starts counting it afresh; should that group fire
        again, its BatchReady has the same event id as the first, and consumers drop it.
        """
        old = [g for g, ts in self._done.items() if ts < before_ts_ms]
        for g in old:
            del self._done[g]
        return len(old)

    def _fire_if_ready(self, group_id: str, group: _Group) -> BatchReady | None:
        size = group.size if group.size is not None else self.default_size
        if size is None or len(group.members) < size:
            return None
        ids = sorted(group.members)
        generated = [m for m in group.members.values() if m.max_version >= 0]
        ts = max(m.ts_ms for m in group.members.values())
        self.ready_groups += 1
        del self._groups[group_id]
        self._done[group_id] = ts
        return BatchReady(
            event_id=batch_event_id(group_id),
            ts_ms=ts,
            producer=self.producer,
            correlation_id=group_id,
            group_id=group_id,
            task_id=group.task_id,
            trajectory_ids=tuple(ids),
            num_samples=len(ids),
            min_version=min((m.min_version for m in generated), default=-1),
            max_version=max((m.max_version for m in generated), default=-1),
            ready_groups=self.ready_groups,
        )


# --- sessions ----------------------------------------------------------------------------------


class _Session:
    __slots__ = ("agent_id", "ended", "group_id", "group_size", "last_ts_ms", "seq", "session_id", "task_id",
                 "tree")

    def __init__(self, session_id: str, ts_ms: int) -> None:
        self.session_id = session_id
        self.agent_id = ""
        self.task_id = ""
        self.group_id = ""
        self.group_size = 0
        self.last_ts_ms = ts_ms
        self.ended: SessionEnded | None = None
        self.tree = PrefixTree()
        self.seq = 0

    def learn(self, agent_id: str, task_id: str, group_id: str, ts_ms: int) -> None:
        """First non-empty ids win; the newest input time drives the TTL."""
        self.agent_id = self.agent_id or agent_id
        self.task_id = self.task_id or task_id
        self.group_id = self.group_id or group_id
        self.last_ts_ms = max(self.last_ts_ms, ts_ms)

    def delta(self, tree: TreeDelta) -> SessionDelta:
        out = SessionDelta(self.session_id, self.seq, self.agent_id, self.task_id, self.group_id,
                           self.group_size, self.last_ts_ms, self.ended, tree)
        self.seq += 1
        return out


class TrajectoryAssembler:
    """Builds one Trajectory per session from its calls; see the module docstring for the rules."""

    def __init__(self, config: AssemblerConfig | None = None) -> None:
        self.config = config or AssemblerConfig()
        self.tracker = GroupTracker(self.config.group_size, self.config.producer)
        self.stats = AssemblerStats()
        self._sessions: dict[str, _Session] = {}
        self._closed: dict[str, CloseMarker] = {}

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    def is_closed(self, session_id: str) -> bool:
        return session_id in self._closed

    def tree(self, session_id: str) -> PrefixTree | None:
        """The open session's tree (read-only use)."""
        session = self._sessions.get(session_id)
        return session.tree if session else None

    # --- inputs ---

    def on_event(self, event: SessionStarted | LLMCall | SessionEnded) -> Emitted:
        """Dispatches an input event by type (the shell's and a replay's single entry point)."""
        if isinstance(event, LLMCall):
            return self.on_call(event)
        if isinstance(event, SessionEnded):
            return self.on_session_ended(event)
        return self.on_session_started(event)

    def on_session_started(self, started: SessionStarted) -> Emitted:
        if started.session_id in self._closed:
            return Emitted()
        session = self._session(started.session_id, started.ts_ms)
        session.learn(started.agent_id, started.task_id, started.group_id, started.ts_ms)
        batches: tuple[BatchReady, ...] = ()
        size = self._metadata_group_size(started)
        if size and not session.group_size:
            session.group_size = size
            batch = (self.tracker.expect(session.group_id, size, session.task_id)
                     if session.group_id and self.config.track_groups else None)
            batches = (batch,) if batch else ()
        return Emitted(deltas=(session.delta(session.tree.empty_delta()),), batches=batches)

    def on_call(self, call: LLMCall) -> Emitted:
        """Merges a call into its session's tree.

        Raises a RejectedCallError (malformed, or a known call id with other content) after counting
        it; the session is unchanged and the shell dead-letters the call.
        """
        self.stats.calls += 1
        marker = self._closed.get(call.session_id)
        if marker is not None:
            return self._on_call_after_close(call, marker)
        is_new = call.session_id not in self._sessions
        session = self._session(call.session_id, call.ts_ms)
        try:
            tree_delta = session.tree.insert(call)
        except RejectedCallError:
            self.stats.rejected_calls += 1
            if is_new:
                del self._sessions[call.session_id]
            raise
        if not tree_delta:
            self.stats.duplicate_calls += 1
            return Emitted()
        session.learn(call.agent_id, call.task_id, call.group_id, call.ts_ms)
        out = Emitted(deltas=(session.delta(tree_delta),))
        if session.ended is not None and session.tree.num_calls >= session.ended.num_calls:
            out += self._close(session, session.ended.status, session.ended.reward,
                               max(session.ended.ts_ms, session.last_ts_ms))
        return out

    def _on_call_after_close(self, call: LLMCall, marker: CloseMarker) -> Emitted:
        if marker.call_digests is not None and call_digest(call.call_id) in marker.call_digests:
            self.stats.redelivered_calls += 1
            return Emitted()
        self.stats.late_calls += 1
        if marker.call_digests is None:  # an old marker: cannot tell, drop as before
            logger.warning("call %s dropped: session already closed", call.call_id,
                           extra={**_LOG, "session": call.session_id})
            return Emitted()
        raise LateCallError(f"call {call.call_id!r} arrived after session {call.session_id!r} closed, and is not"
                            f" in its trajectory of {len(marker.call_digests)} calls")

    def on_session_ended(self, ended: SessionEnded) -> Emitted:
        if ended.session_id in self._closed or (
            ended.session_id in self._sessions and self._sessions[ended.session_id].ended is not None
        ):
            self.stats.duplicate_ends += 1
            return Emitted()
        session = self._session(ended.session_id, ended.ts_ms)
        session.learn(ended.agent_id, ended.task_id, ended.group_id, ended.ts_ms)
        if self.config.wait_for_calls and ended.num_calls > session.tree.num_calls:
            self.stats.waiting_ends += 1
            session.ended = ended
            return Emitted(deltas=(session.delta(session.tree.empty_delta()),))
        return self._close(session, ended.status, ended.reward, max(ended.ts_ms, session.last_ts_ms))

    def expire(self, now_ms: int, ttl_ms: int) -> Emitted:
        """Closes sessions with no input for `ttl_ms`, oldest first, and forgets old tombstones.

        A session that never ended closes with status timeout and reward 0.0 at ts newest input +
        ttl; one waiting for in-flight calls closes with its SessionEnded's status and reward.
        """
        if ttl_ms < 0:
            raise ConfigError(f"ttl_ms must be >= 0, got {ttl_ms}")
        due = sorted(
            (s.last_ts_ms + ttl_ms, sid) for sid, s in self._sessions.items() if s.last_ts_ms + ttl_ms <= now_ms
        )
        out = Emitted()
        for deadline, sid in due:
            session = self._sessions[sid]
            if session.ended is None:
                self.stats.timeouts += 1
                out += self._close(session, SessionStatus.TIMEOUT, 0.0, deadline)
            else:
                self.stats.incomplete_closes += 1
                logger.warning(
                    "session closed with %d of %d calls", session.tree.num_calls, session.ended.num_calls,
                    extra={**_LOG, "session": sid},
                )
                out += self._close(session, session.ended.status, session.ended.reward,
                                   max(session.ended.ts_ms, session.last_ts_ms))
        horizon = now_ms - self.config.closed_retention_ms
        for sid in [sid for sid, m in self._closed.items() if m.ts_ms < horizon]:
            del self._closed[sid]
        self.tracker.forget(horizon)
        return out

    def restore(self, delta: SessionDelta) -> Emitted:
        """Replays a persisted SessionDelta (the table's log, in seq order) to rebuild an open session."""
        session = self._sessions.get(delta.session_id)
        if session is None:
            if delta.seq != 0:
                raise DeltaError(f"session {delta.session_id!r}: first delta has seq {delta.seq}, expected 0")
            session = self._session(delta.session_id, delta.last_ts_ms)
        if delta.seq != session.seq:
            raise DeltaError(f"session {delta.session_id!r}: delta seq {delta.seq}, expected {session.seq}")
        session.tree.apply_delta(delta.tree)
        session.agent_id, session.task_id, session.group_id = delta.agent_id, delta.task_id, delta.group_id
        session.last_ts_ms, session.ended = delta.last_ts_ms, delta.ended
        session.seq += 1
        if delta.group_size and not session.group_size and session.group_id and self.config.track_groups:
            session.group_size = delta.group_size
            batch = self.tracker.expect(session.group_id, delta.group_size, session.task_id)
            return Emitted(batches=(batch,) if batch else ())
        session.group_size = session.group_size or delta.group_size
        return Emitted()

    def restore_closed(self, session_id: str, marker: CloseMarker) -> None:
        """Rebuilds a closed session's tombstone (persisted by a shell) so that inputs re-read after a
        restart do not re-open it; an open session of that id is dropped."""
        self._sessions.pop(session_id, None)
        self._closed[session_id] = marker

    # --- internals ---

    def _session(self, session_id: str, ts_ms: int) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session(session_id, ts_ms)
        return session

    def _metadata_group_size(self, started: SessionStarted) -> int:
        raw = started.metadata.get(self.config.group_size_key)
        if raw is None:
            return 0
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if size < 1:
            logger.warning("bad group size %r in metadata ignored", raw,
                           extra={**_LOG, "session": started.session_id})
            return 0
        return size

    def _close(self, session: _Session, status: SessionStatus, reward: float, ts_ms: int) -> Emitted:
        tree = session.tree
        ended = session.ended
        trajectory = Trajectory(
            event_id=trajectory_event_id(session.session_id),
            ts_ms=ts_ms,
            producer=self.config.producer,
            correlation_id=session.session_id,
            trajectory_id=session.session_id,
            session_id=session.session_id,
            agent_id=(ended.agent_id if ended else "") or session.agent_id,
            task_id=(ended.task_id if ended else "") or session.task_id,
            group_id=(ended.group_id if ended else "") or session.group_id,
            reward=float(reward),
            status=SessionStatus(status).value,
            nodes=tree.nodes(),
            call_ids=tree.call_ids,
            min_version=tree.min_version,
            max_version=tree.max_version,
            tokens_in_calls=tree.tokens_in_calls,
            tokens_in_tree=tree.tokens_in_tree,
            drift_calls=tree.drift_calls,
        )
        del self._sessions[session.session_id]
        self._closed[session.session_id] = CloseMarker.of(ts_ms, trajectory.call_ids)
        self.stats.trajectories += 1
        if not self.config.track_groups:
            return Emitted(trajectories=(trajectory,), closed_sessions=(session.session_id,))
        # the session's own size first (its group id may have come after SessionStarted), then the sample
        sized = (
            self.tracker.expect(trajectory.group_id, session.group_size, trajectory.task_id)
            if session.group_size and trajectory.group_id
            else None
        )
        added = self.tracker.add(trajectory)
        return Emitted(
            trajectories=(trajectory,),
            batches=tuple(b for b in (sized, added) if b is not None),
            closed_sessions=(session.session_id,),
        )

