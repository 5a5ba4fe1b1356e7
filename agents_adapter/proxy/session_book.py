"""The capture proxy's session bookkeeping: who owns a session, where it is in its life, how it ends.

Session lifecycle: `open` from its first call; `POST /v1/sessions/{id}/end` with a reward publishes
SessionEnded (after the session's calls in flight finished, so `num_calls` counts them all); without
a reward the session waits in `awaiting_reward` until `/reward` brings it. An ended session takes no
more calls (409). Sessions belong to the agent that opened them (403 for any other agent).

Durable sessions (`session_store`): owner, counters, phase and the events of every request are
written to the store before Kafka is asked for them, so what the in-memory cache forgets (LRU, TTL,
a restart) comes back from the store: `/end` after a restart publishes the right `num_calls`, the
owner is still enforced, and the session's token-in/token-out cache is rebuilt (no drift).

`/end` and `/reward` are idempotent: a repeated request gets the first answer and publishes nothing;
a different one for a session already closed is refused (409). Closes of one session are serialized,
so concurrent `/reward`s, or `/end` racing `/reward`, publish exactly one SessionEnded. A close a
crash interrupted, and events a crash left unacknowledged, are published when the proxy is back
(`recover`, run by `maintain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Hashable, Iterator
from typing import Any

from agents_adapter.errors import (
    DrainingError,
    ProxyError,
    SessionClosedError,
    SessionForbiddenError,
    UnknownSessionError,
)
from agents_adapter.proxy.config import AdapterConfig
from agents_adapter.proxy.recording import Recorder, session_ended
from agents_adapter.proxy.routing import RoutingTable
from agents_adapter.proxy.session_cache import SessionCache, SessionState
from agents_adapter.proxy.session_store import SessionStore
from agents_adapter.proxy.tito import TitoBuilder
from schemas.events import LLMCall, SessionStarted, SessionStatus

logger = logging.getLogger(__name__)
_END_WAIT_POLL_S = 0.05


class KeyedLocks:
    """One asyncio lock per key, dropped once nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[key]

    def held(self, key: Hashable) -> bool:
        return key in self._locks


class SessionBook:
    """Sessions from the cache or the store, their owners and phases, and their ends (see the module doc)."""

    def __init__(self, config: AdapterConfig, tito: TitoBuilder, routing: RoutingTable, recorder: Recorder) -> None:
        self.config = config
        self.tito = tito
        self.routing = routing
        self.recorder = recorder
        self.sessions = SessionCache(config.session_cache_size, config.session_ttl_s, on_evict=self._evicted)
        self.store = SessionStore(config.session_store_path)
        self._closing = KeyedLocks()  # session: one /end or /reward at a time
        self._records = KeyedLocks()  # (session, request key): one publication of a record at a time
        self._live: Counter[str] = Counter()  # requests in flight per session (an end waits for them)
        self.draining = False
        self.inflight = 0
        self.open_sessions_evicted = 0
        self.sessions_restored = 0
        self.events_republished = 0
        self.events_found_on_log = 0  # left unacknowledged by a crash, but Kafka had stored them

    # ----- finding a session

    def _evicted(self, state: SessionState, why: str) -> None:
        """The cache forgot a session; the store keeps it (it comes back on its next request)."""
        self.routing.forget_session(state.session_id)
        if state.phase != "ended":
            self.open_sessions_evicted += 1
            logger.info("open session left the cache (kept in the store)",
                        extra={"session": state.session_id, "agent": state.agent_id, "why": why})

    def cached(self, session_id: str) -> SessionState | None:
        """The session from the cache, else from the store (with its token-in/token-out cache rebuilt)."""
        state = self.sessions.get(session_id)
        if state is not None:
            return state
        stored = self.store.load(session_id)
        if stored is None:
            return None
        for kept in self.store.recent_calls(session_id, self.config.calls_cached_per_session):
            call = kept.event
            if isinstance(call, LLMCall) and kept.tito is not None:
                self.tito.restore(stored, kept.tito, call.call_id, list(call.prompt_ids), list(call.output_ids),
                                  call.parent_call_id)
                if not kept.acked:
                    stored.unlogged.add(call.call_id)
        self.sessions_restored += 1
        state, _ = self.sessions.get_or_create(session_id, lambda: stored)
        return state

    def open_for_call(self, session_id: str, agent_id: str, task_id: str, group_id: str,
                      metadata: dict[str, str]) -> SessionState:
        """The session a call goes to (created on its first call): the caller's own, and still open."""
        state = self.cached(session_id)
        if state is None:
            state, _ = self.sessions.get_or_create(session_id, lambda: SessionState(
                session_id, agent_id, task_id, group_id, dict(metadata)))
            self.store.save(state)
        if state.agent_id != agent_id:
            raise SessionForbiddenError(f"session {session_id!r} belongs to another agent")
        if state.phase != "open":
            raise SessionClosedError(f"session {session_id!r} has ended ({state.phase}): start a new session")
        state.task_id = state.task_id or task_id
        state.group_id = state.group_id or group_id
        return state

    def _owned(self, agent_id: str, session_id: str) -> SessionState | None:
        state = self.cached(session_id)
        if state is not None and state.agent_id != agent_id:
            raise SessionForbiddenError(f"session {session_id!r} belongs to another agent")
        return state

    @contextlib.contextmanager
    def admitted(self, session_id: str) -> Iterator[None]:
        """Counts a request in flight (for its session's end, and for a drain); none while draining."""
        if self.draining:
            raise DrainingError("the proxy is draining and takes no new calls; retry on another instance")
        self.inflight += 1
        self._live[session_id] += 1
        try:
            yield
        finally:
            self.inflight -= 1
            self._live[session_id] -= 1
            if self._live[session_id] == 0:
                del self._live[session_id]

    @contextlib.asynccontextmanager
    async def publishing(self, session_id: str, request_key: str) -> AsyncIterator[None]:
        """Held while a request's events are stored, published and acknowledged, so that `republish`
        (recovery, a retried request) never publishes a record whose first publication is under way."""
        async with self._records.hold((session_id, request_key)):
            yield

    async def republish(self, state: SessionState, request_key: str, on_log: set[str] | None = None) -> None:
        """A request's events a crash left unacknowledged: those the log does not hold are published.

        `on_log` is what the log held when recovery began (event ids; read now when not given). The
        dead process may have had them stored without learning it, and publishing them again would be a
        second copy on the log (same ids, but every reader of the raw log would see two calls)."""
        async with self.publishing(state.session_id, request_key):
            left = [c.event for c in self.store.calls(state.session_id, request_key) if not c.acked]
            if not left:
                return  # acknowledged or abandoned meanwhile by the request that published them
            held = await self.recorder.ids_on_log(left) if on_log is None else on_log
            missing = [e for e in left if e.event_id not in held]
            if missing:
                await self.recorder.record(missing)
            state.started_recorded = state.started_recorded or any(isinstance(e, SessionStarted) for e in left)
            self.store.acked(state, request_key, self.config.calls_cached_per_session)
            self.events_republished += len(missing)
            self.events_found_on_log += len(left) - len(missing)

    # ----- session ends and rewards

    async def end_session(self, agent_id: str, session_id: str, reward: float | None, status: str,
                          task_id: str = "", group_id: str = "") -> dict[str, Any]:
        """`task_id` / `group_id` come with the end request too: a session that failed before its first
        call reached this proxy (it was down) is still ended in its task group, which can then complete.

        A repeated end (the same reward and status: a client retry) gets the first answer."""
        request = {"reward": reward, "status": status}
        async with self._closing.hold(session_id):
            state = self._owned(agent_id, session_id)
            if state is None:  # never called here: end it anyway (no call)
                state, _ = self.sessions.get_or_create(session_id, lambda: SessionState(session_id, agent_id))
            if state.phase != "open":
                return await self._closed_answer(state, "end", request)
            state.task_id = state.task_id or task_id
            state.group_id = state.group_id or group_id
            if reward is not None:
                return await self._close(state, "end", request, reward, SessionStatus(status))
            state.phase = "awaiting_reward"
            state.metadata["pending_status"] = status
            await self._wait_idle(session_id)
            answer = session_view(state)
            self.store.save_close(state, "end", request, answer)
            return answer

    async def report_reward(self, agent_id: str, session_id: str, reward: float, status: str | None) -> dict[str, Any]:
        request = {"reward": reward, "status": status}
        async with self._closing.hold(session_id):
            state = self._owned(agent_id, session_id)
            if state is None:
                raise UnknownSessionError(f"session {session_id!r} is not known here (never opened, or forgotten)")
            if state.phase in ("ending", "ended"):
                return await self._closed_answer(state, "reward", request)
            chosen = status or state.metadata.get("pending_status", "completed")
            return await self._close(state, "reward", request, reward, SessionStatus(chosen))

    async def _closed_answer(self, state: SessionState, via: str, request: dict[str, Any]) -> dict[str, Any]:
        """A session already closing or closed: the same request again gets its answer, another one 409."""
        if state.phase == "ending":  # a close a crash interrupted (it holds no lock: we hold it)
            await self._finish_close(state)
        record = self.store.close_record(state.session_id, via)
        if record is not None and record.answer is not None and {k: record.request.get(k) for k in request} == request:
            return record.answer
        if via == "reward":
            raise SessionClosedError(f"session {state.session_id!r} already has its reward ({state.reward})")
        raise SessionClosedError(f"session {state.session_id!r} has already ended ({state.phase})")

    async def _close(self, state: SessionState, via: str, request: dict[str, Any], reward: float,
                     status: SessionStatus) -> dict[str, Any]:
        """Publishes the one SessionEnded of the session (the caller holds its close lock).

        The close is stored (no answer yet) before it is published, so that a crash in between is
        finished when the proxy is back (`recover`)."""
        previous = state.phase
        state.phase = "ending"  # no new calls while we wait for those in flight
        stored = request | {"chosen_status": status.value}
        try:
            self.store.save_close(state, via, stored, None)
            await self._wait_idle(state.session_id)
            await self.recorder.record([session_ended(state, reward, status, self.config.instance_id)])
        except BaseException:
            state.phase = previous
            self.store.drop_close(state, via)
            raise
        return self._ended(state, via, stored, reward, status)

    def _ended(self, state: SessionState, via: str, stored: dict[str, Any], reward: float,
               status: SessionStatus) -> dict[str, Any]:
        state.phase, state.reward = "ended", reward
        state.metadata.pop("pending_status", None)
        answer = session_view(state) | {"status": status.value}
        self.store.save_close(state, via, stored, answer)
        return answer

    async def _finish_close(self, state: SessionState) -> None:
        """A close a crash interrupted: its calls and its SessionEnded are published now (it stays
        `ending` if Kafka refuses, for the next try)."""
        record = self.store.unfinished_close(state.session_id)
        stored = record.request if record is not None else {"reward": 0.0, "status": None, "chosen_status": "failed"}
        reward, status = float(stored.get("reward") or 0.0), SessionStatus(str(stored.get("chosen_status") or "failed"))
        end = session_ended(state, reward, status, self.config.instance_id)
        left = {key: events for (session_id, key), events in self.store.unacked().items()
                if session_id == state.session_id}
        # one read of the log for the session's records and its end (the crash may have come after either)
        on_log = await self.recorder.ids_on_log([end, *(e for events in left.values() for e in events)])
        for key in left:
            await self.republish(state, key, on_log)
        if end.event_id not in on_log:
            await self.recorder.record([end])
        self._ended(state, record.via if record is not None else "end", stored, reward, status)
        logger.info("session end interrupted by a restart finished", extra={"session": state.session_id})

    async def _wait_idle(self, session_id: str) -> None:
        deadline = time.monotonic() + self.config.long_request_timeout_s
        while session_id in self._live and time.monotonic() < deadline:
            await asyncio.sleep(_END_WAIT_POLL_S)

    def session_info(self, agent_id: str, session_id: str) -> dict[str, Any]:
        state = self._owned(agent_id, session_id)
        if state is None:
            raise UnknownSessionError(f"session {session_id!r} is not known here (never opened, or forgotten)")
        return session_view(state)

    # ----- recovery, housekeeping, drain

    async def recover(self) -> None:
        """Publishes what a crash left unacknowledged (calls, then interrupted ends). Safe to call again."""
        left = {record: events for record, events in self.store.unacked().items() if not self._records.held(record)}
        on_log = await self.recorder.ids_on_log([e for events in left.values() for e in events]) if left else set()
        for session_id, key in left:
            state = self.cached(session_id)
            if state is not None:
                await self.republish(state, key, on_log)
        for session_id in self.store.session_ids(("ending",)):
            async with self._closing.hold(session_id):
                state = self.cached(session_id)
                if state is not None and state.phase == "ending":
                    await self._finish_close(state)

    async def maintain(self) -> None:
        """One round of housekeeping (the app runs it at start and every 30 s): recovery, cache and store
        expiry. A Kafka still down leaves the recovery to the next round."""
        try:
            await self.recover()
        except ProxyError as e:
            logger.warning("recovery of stored events postponed: %s", e)
        self.sessions.sweep()
        try:
            self.store.prune(self.config.session_ttl_s)
        except ProxyError as e:
            logger.warning("session store pruning failed: %s", e)

    async def drain(self, stop_accepting: bool, timeout_s: float, end_sessions: bool) -> dict[str, Any]:
        """Stops taking calls, waits for those in flight, optionally ends open sessions (aborted)."""
        self.draining = stop_accepting
        deadline = time.monotonic() + timeout_s
        while stop_accepting and self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(_END_WAIT_POLL_S)
        ended = 0
        if end_sessions:
            ended = sum(await asyncio.gather(*(
                self._abort(sid) for sid in self.store.session_ids(("open", "awaiting_reward")))))
        return {"draining": self.draining, "inflight": self.inflight, "sessions_ended": ended}

    async def _abort(self, session_id: str) -> int:
        async with self._closing.hold(session_id):
            state = self.cached(session_id)
            if state is None or state.phase not in ("open", "awaiting_reward"):
                return 0
            await self._close(state, "drain", {"reward": 0.0, "status": "aborted"}, 0.0, SessionStatus.ABORTED)
            return 1

    def stats(self) -> dict[str, Any]:
        return {
            "cached": len(self.sessions),
            "by_phase": dict(Counter(s.phase for s in self.sessions)),
            "evicted_lru": self.sessions.evicted_lru,
            "expired_ttl": self.sessions.expired_ttl,
            "open_sessions_evicted": self.open_sessions_evicted,
            "restored_from_store": self.sessions_restored,
        }


def session_view(state: SessionState) -> dict[str, Any]:
    """What the session endpoints answer."""
    return {
        "session_id": state.session_id,
        "agent_id": state.agent_id,
        "task_id": state.task_id,
        "group_id": state.group_id,
        "phase": state.phase,
        "num_calls": state.calls_served,
        "drift_calls": state.drift_calls,
        "reward": state.reward,
    }
