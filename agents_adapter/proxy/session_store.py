"""The capture proxy's durable session state: SQLite (WAL) in `AdapterConfig.session_store_path`.

Why a store and not a rebuild from the bus: the proxy must answer `/end` with the right `num_calls`
and enforce a session's owner the moment it is back, before any replay of `llm.calls` could finish,
and a retried request must find what its first try served. So what the in-memory `SessionCache`
forgets (LRU, TTL, a restart) is kept here, and the cache is only a cache of it:

- `sessions`: owner, task, group, metadata, phase, call and turn counters, reward. Written when a
  session is created and whenever its counters or phase change.
- `calls`: the events of every request served in a session (SessionStarted, LLMCall), keyed by the
  request's idempotency key (`Idempotency-Key` header, else a fresh one), with what token-in/token-out
  needs to rebuild the session's prompt cache (`tito`). They are written *before* Kafka is asked to
  store them and marked `acked` after it did: a crash in between leaves them un-acked, and the proxy
  publishes those the log does not hold when it is back (`unacked`; `SessionBook.republish`). So the
  counters never lag behind the log (a low `num_calls` makes the trajectory processor drop later calls
  as late), and a retried request (same key) gets the calls it already got, never a second copy.
  A session keeps its last `calls_cached_per_session` of them; all are deleted when it ends. The
  store's size is thus about open sessions x calls_cached_per_session x a call's tokens.
- `closes`: the `/end` and `/reward` requests of a session and their answers: a repeated request gets
  the same answer and publishes nothing; a close interrupted by a crash (no answer yet) is finished
  when the proxy is back.

A request's acknowledgement is noted in memory and written with the store's next transaction (a later
call's, any read's, the sweep's `flush`, `close`): one transaction per served call, not two. A crash
before that write leaves the request un-acked, the state a crash between Kafka's acknowledgement and the
store's note always could leave, and the restarted proxy reads the log to publish only what it lacks.

Durability: WAL with synchronous=NORMAL survives the process being killed (the OS holds the pages),
not a power loss; the proxy's own crash is the failure it is for. Rows of sessions idle longer than
`session_ttl_s` are pruned. `session_store_path=None` keeps the store in memory: sessions then
survive cache eviction but not a restart.

Everything runs on the proxy's event loop (one connection, short transactions): the order of
writes is the order of the requests, with no lock to take.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents_adapter.errors import ConfigError, ServiceUnavailableError
from agents_adapter.proxy.session_cache import SessionState
from schemas.events import Event, decode_event, encode_event

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, task_id TEXT NOT NULL, group_id TEXT NOT NULL,
    metadata TEXT NOT NULL, phase TEXT NOT NULL, started_recorded INTEGER NOT NULL, calls_served INTEGER NOT NULL,
    next_turn INTEGER NOT NULL, drift_calls INTEGER NOT NULL, reward REAL, updated_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS sessions_by_age ON sessions (updated_ms);
CREATE TABLE IF NOT EXISTS calls (
    session_id TEXT NOT NULL, request_key TEXT NOT NULL, seq INTEGER NOT NULL, event BLOB NOT NULL,
    acked INTEGER NOT NULL, tito TEXT, PRIMARY KEY (session_id, request_key, seq));
CREATE INDEX IF NOT EXISTS calls_unacked ON calls (acked);
CREATE TABLE IF NOT EXISTS closes (
    session_id TEXT NOT NULL, via TEXT NOT NULL, request TEXT NOT NULL, answer TEXT,
    PRIMARY KEY (session_id, via));
"""
_FIELDS = ("session_id", "agent_id", "task_id", "group_id", "metadata", "phase", "started_recorded",
           "calls_served", "next_turn", "drift_calls", "reward", "updated_ms")


@dataclass(frozen=True)
class StoredCall:
    """One event a request recorded, whether Kafka acknowledged it, and its prompt-cache entry."""

    request_key: str
    event: Event
    acked: bool
    tito: dict[str, Any] | None


@dataclass(frozen=True)
class CloseRecord:
    """An `/end` or `/reward` request (`via`) of a session, and its answer once it was given."""

    via: str
    request: dict[str, Any]
    answer: dict[str, Any] | None


class SessionStore:
    """See the module doc. sqlite errors become `ServiceUnavailableError` (503: the call is not served)."""

    def __init__(self, path: Path | None) -> None:
        try:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(":memory:" if path is None else str(path), isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise ConfigError(f"session_store_path={str(path)!r} cannot be opened as a SQLite store: {e}") from e
        # acknowledged requests not written yet: (session, request key) -> (the session, calls to keep)
        self._acks: dict[tuple[str, str], tuple[SessionState, int]] = {}

    @contextmanager
    def _write(self, writes: SessionState | None = None) -> Iterator[sqlite3.Connection]:
        """A transaction that first writes the pending acknowledgements (`writes`: the session the
        transaction upserts itself, not upserted twice)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._write_acks(writes)
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            self._acks.clear()
        except sqlite3.Error as e:
            raise ServiceUnavailableError(f"the session store failed: {e}; the request was not served") from e

    def _write_acks(self, writes: SessionState | None) -> None:
        for (session_id, request_key), (state, keep) in self._acks.items():
            if state is not writes:
                _upsert(self._db, state)
            self._db.execute("UPDATE calls SET acked = 1 WHERE session_id = ? AND request_key = ?",
                             (session_id, request_key))
            self._db.execute("DELETE FROM calls WHERE session_id = ? AND acked = 1 AND rowid NOT IN "
                             "(SELECT rowid FROM calls WHERE session_id = ? ORDER BY rowid DESC LIMIT ?)",
                             (session_id, session_id, keep))

    def flush(self) -> None:
        """Writes the pending acknowledgements now (the sweep's: a proxy idle after its last call)."""
        if self._acks:
            with self._write():
                pass

    def _read(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        self.flush()
        return self._read_as_written(sql, *args)

    def _read_as_written(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise ServiceUnavailableError(f"the session store failed: {e}") from e

    # ----- sessions

    def load(self, session_id: str) -> SessionState | None:
        """The session as last written (its prompt cache empty: see `recent_calls`)."""
        rows = self._read(f"SELECT {', '.join(_FIELDS)} FROM sessions WHERE session_id = ?", session_id)
        if not rows:
            return None
        row = dict(zip(_FIELDS, rows[0], strict=True))
        return SessionState(
            row["session_id"], row["agent_id"], row["task_id"], row["group_id"], json.loads(row["metadata"]),
            phase=row["phase"], started_recorded=bool(row["started_recorded"]), calls_served=row["calls_served"],
            next_turn=row["next_turn"], drift_calls=row["drift_calls"], reward=row["reward"],
        )

    def save(self, state: SessionState) -> None:
        with self._write() as db:
            _upsert(db, state)

    def session_ids(self, phases: Sequence[str]) -> list[str]:
        marks = ", ".join("?" * len(phases))
        return [r[0] for r in self._read(f"SELECT session_id FROM sessions WHERE phase IN ({marks})", *phases)]

    def prune(self, idle_s: float) -> int:
        """Forgets sessions not written for `idle_s`; returns how many."""
        cutoff = _now_ms() - int(idle_s * 1000)
        with self._write() as db:
            old = "SELECT session_id FROM sessions WHERE updated_ms < ?"
            db.execute(f"DELETE FROM calls WHERE session_id IN ({old})", (cutoff,))
            db.execute(f"DELETE FROM closes WHERE session_id IN ({old})", (cutoff,))
            return db.execute("DELETE FROM sessions WHERE updated_ms < ?", (cutoff,)).rowcount

    # ----- calls

    def begin_calls(self, state: SessionState, request_key: str, events: Sequence[Event],
                    titos: Sequence[dict[str, Any] | None]) -> list[bytes]:
        """The request's events (before Kafka has them) and the counters that already count them; returns
        the events as stored, their encoding (what the producer can publish without encoding them again)."""
        encoded = [encode_event(e) for e in events]
        with self._write(state) as db:
            _upsert(db, state)
            db.executemany(
                "INSERT OR REPLACE INTO calls VALUES (?, ?, ?, ?, 0, ?)",
                [(state.session_id, request_key, i, value, None if t is None else json.dumps(t))
                 for i, (value, t) in enumerate(zip(encoded, titos, strict=True))],
            )
        return encoded

    def acked(self, state: SessionState, request_key: str, keep: int) -> None:
        """Kafka stored the request's events (`state` as it is after that); of the session's acknowledged
        events only the last `keep` stay (what its prompt cache holds; a retry comes before later calls).
        Written with the next transaction (module doc)."""
        self._acks[(state.session_id, request_key)] = (state, keep)

    def abandon_calls(self, state: SessionState, request_key: str) -> None:
        """Kafka refused the request's events: they were not served (counters rolled back in `state`)."""
        with self._write() as db:
            _upsert(db, state)
            db.execute("DELETE FROM calls WHERE session_id = ? AND request_key = ?", (state.session_id, request_key))

    def calls(self, session_id: str, request_key: str) -> list[StoredCall]:
        query = ("SELECT request_key, event, acked, tito FROM calls WHERE session_id = ? AND request_key = ?"
                 " ORDER BY seq")
        # a request's first try (no rows) is the common case: pending acknowledgements cannot change that
        rows = self._read_as_written(query, session_id, request_key)
        if rows and self._acks:
            rows = self._read(query, session_id, request_key)
        return [_stored(row) for row in rows]

    def recent_calls(self, session_id: str, limit: int) -> list[StoredCall]:
        """The session's last `limit` events with a prompt-cache entry, oldest first."""
        rows = self._read("SELECT request_key, event, acked, tito FROM calls WHERE session_id = ? AND tito IS NOT NULL"
                          " ORDER BY rowid DESC LIMIT ?", session_id, limit)
        return [_stored(row) for row in reversed(rows)]

    def unacked(self) -> dict[tuple[str, str], list[Event]]:
        """Events a crash left without Kafka's acknowledgement, by (session, request key)."""
        out: dict[tuple[str, str], list[Event]] = {}
        for session_id, key, event in self._read(
                "SELECT session_id, request_key, event FROM calls WHERE acked = 0 ORDER BY rowid"):
            out.setdefault((session_id, key), []).append(decode_event(event))
        return out

    # ----- closes

    def close_record(self, session_id: str, via: str) -> CloseRecord | None:
        rows = self._read("SELECT request, answer FROM closes WHERE session_id = ? AND via = ?", session_id, via)
        if not rows:
            return None
        request, answer = rows[0]
        return CloseRecord(via, json.loads(request), None if answer is None else json.loads(answer))

    def unfinished_close(self, session_id: str) -> CloseRecord | None:
        rows = self._read("SELECT via FROM closes WHERE session_id = ? AND answer IS NULL", session_id)
        return self.close_record(session_id, rows[0][0]) if rows else None

    def save_close(self, state: SessionState, via: str, request: dict[str, Any],
                   answer: dict[str, Any] | None) -> None:
        """The close request (answer None: under way) with the session; an ended session drops its calls."""
        with self._write() as db:
            _upsert(db, state)
            db.execute("INSERT OR REPLACE INTO closes VALUES (?, ?, ?, ?)",
                       (state.session_id, via, json.dumps(request), None if answer is None else json.dumps(answer)))
            if state.phase == "ended":
                db.execute("DELETE FROM calls WHERE session_id = ?", (state.session_id,))

    def drop_close(self, state: SessionState, via: str) -> None:
        with self._write() as db:
            _upsert(db, state)
            db.execute("DELETE FROM closes WHERE session_id = ? AND via = ?", (state.session_id, via))

    def close(self) -> None:
        with suppress(ServiceUnavailableError):
            self.flush()
        with suppress(sqlite3.Error):
            self._db.close()


def _upsert(db: sqlite3.Connection, state: SessionState) -> None:
    db.execute(
        f"INSERT OR REPLACE INTO sessions ({', '.join(_FIELDS)}) VALUES ({', '.join('?' * len(_FIELDS))})",
        (state.session_id, state.agent_id, state.task_id, state.group_id, json.dumps(state.metadata), state.phase,
         int(state.started_recorded), state.calls_served, state.next_turn, state.drift_calls, state.reward,
         _now_ms()),
    )


def _stored(row: tuple[Any, ...]) -> StoredCall:
    key, event, acked, tito = row
    return StoredCall(key, decode_event(event), bool(acked), None if tito is None else json.loads(tito))


def _now_ms() -> int:
    return int(time.time() * 1000)
