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
    Counted by `group_tracker.GroupTracker` (its module doc says where n comes from).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from agents_adapter.errors import ConfigError, DeltaError, LateCallError, RejectedCallError
from agents_adapter.processor.call_refs import in_full_form
from agents_adapter.processor.group_tracker import GroupTracker
from agents_adapter.processor.prefix_tree import PrefixTree
from agents_adapter.processor.session_records import CloseMarker, SessionDelta, call_digest, trajectory_event_id
from agents_adapter.processor.tree_delta import TreeDelta
from schemas.events import (
    BatchReady,
    LLMCall,
    SessionEnded,
    SessionStarted,
    SessionStatus,
    Trajectory,
)

logger = logging.getLogger(__name__)

_LOG: Final = {"service": "agents_adapter"}


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


# --- sessions ----------------------------------------------------------------------------------


class _Session:
    __slots__ = ("agent_id", "ended", "group_id", "group_size", "last_call", "last_ts_ms", "seq", "session_id",
                 "task_id", "tree")

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
        # the last merged call's id and prompt+output ids (packed): what the next call's reference mostly names,
        # read without walking the tree
        self.last_call: tuple[str, bytes] = ("", b"")

    def ids_of(self, call_id: str) -> bytes:
        """A merged call's prompt+output ids (packed int32); raises UnknownCallError."""
        last_id, ids = self.last_call
        return ids if call_id == last_id else self.tree.ids_of(call_id).tobytes()

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
            full, extends = in_full_form(session.ids_of, call)
            tree_delta = session.tree.insert(full, extends)
        except RejectedCallError:
            self.stats.rejected_calls += 1
            if is_new:
                del self._sessions[call.session_id]
            raise
        if not tree_delta:
            self.stats.duplicate_calls += 1
            return Emitted()
        session.last_call = (full.call_id, full.prompt_ids.to_bytes() + full.output_ids.to_bytes())
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

