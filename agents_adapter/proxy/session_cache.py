"""The proxy's in-memory sessions: an LRU cache with an idle TTL, a cache of the durable session store.

Each session keeps at most `calls_cached_per_session` served calls (`CachedCall`: the exact ids the
engine read and wrote) for token-in/token-out; what the cache forgets comes back from the store
(`session_store`, `TitoBuilder.restore`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class CachedCall:
    """A served call as the engine saw it: `ids` = prompt + output (int32)."""

    call_id: str
    ids: np.ndarray
    prompt_len: int
    glue: str = ""  # chat: what closes the reply before the next messages
    prompt_text: str = ""  # text completions: the prompt and prompt + served text
    full_text: str = ""


@dataclass(frozen=True)
class ChatChain:
    """The message-prefix hashes of a session's last chat request (`tito._chain`), to reuse on its next one:
    `plain` holds its leading text-only messages (as templated), whose hashes `digests` holds."""

    seed: bytes
    plain: tuple[Mapping[str, Any], ...]
    digests: tuple[bytes, ...]


@dataclass
class SessionState:
    """One agent session: who owns it, its lifecycle, and the served calls kept for token-in/token-out."""

    session_id: str
    agent_id: str
    task_id: str = ""
    group_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    phase: str = "open"  # open -> awaiting_reward (ended, reward to come) -> ended
    started_recorded: bool = False
    calls_served: int = 0
    next_turn: int = 0
    drift_calls: int = 0
    reward: float | None = None
    chat_calls: OrderedDict[bytes, CachedCall] = field(default_factory=OrderedDict)
    text_calls: OrderedDict[str, CachedCall] = field(default_factory=OrderedDict)
    token_calls: OrderedDict[str, CachedCall] = field(default_factory=OrderedDict)
    chat_chain: ChatChain | None = None
    # calls restored into the prompt cache from the store whose events Kafka had not acknowledged (a crash): the
    # recovery republishes them, maybe after this session's next call, so no call is recorded by reference to them
    unlogged: set[str] = field(default_factory=set)
    last_used: float = 0.0


class SessionCache:
    """Sessions by id: least recently used beyond `max_sessions`, forgotten after `ttl_s` idle."""

    def __init__(self, max_sessions: int, ttl_s: float, clock: Callable[[], float] = time.monotonic,
                 on_evict: Callable[[SessionState, str], None] | None = None) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._clock = clock
        self._on_evict = on_evict
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()
        self.evicted_lru = 0
        self.expired_ttl = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[SessionState]:
        return iter(list(self._sessions.values()))

    def get(self, session_id: str) -> SessionState | None:
        state = self._sessions.get(session_id)
        if state is None:
            return None
        now = self._clock()
        if now - state.last_used > self.ttl_s:
            self._drop(session_id, "ttl")
            return None
        state.last_used = now
        self._sessions.move_to_end(session_id)
        return state

    def get_or_create(self, session_id: str, create: Callable[[], SessionState]) -> tuple[SessionState, bool]:
        state = self.get(session_id)
        if state is not None:
            return state, False
        state = create()
        state.last_used = self._clock()
        self._sessions[session_id] = state
        self.sweep()
        while len(self._sessions) > self.max_sessions:
            self._drop(next(iter(self._sessions)), "lru")
        return state, True

    def sweep(self) -> int:
        """Forgets sessions idle longer than the TTL (oldest first); returns how many."""
        now = self._clock()
        expired = 0
        while self._sessions:
            sid, state = next(iter(self._sessions.items()))
            if now - state.last_used <= self.ttl_s:
                break
            self._drop(sid, "ttl")
            expired += 1
        return expired

    def _drop(self, session_id: str, why: str) -> None:
        state = self._sessions.pop(session_id)
        if why == "ttl":
            self.expired_ttl += 1
        else:
            self.evicted_lru += 1
        if self._on_evict is not None:
            self._on_evict(state, why)
