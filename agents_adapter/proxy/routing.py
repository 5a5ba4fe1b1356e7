"""The routing table: which inference resources may take rollout requests now, and which one a call gets.

Fed by events (`apply`, from the resources / scheduler / control topics) and by the static endpoints
of the config; knows nothing of Kafka or HTTP, so tests drive it with plain event objects.

A resource takes new requests when it has an endpoint, the `rollout` capability (unknown = yes for a
static endpoint), activity `rollout` (unknown = yes for a static endpoint; event-fed resources start
`idle` as in the scheduler's pool), is not paused (PauseRollout .. ResumeRollout), not preempted
(Preemption .. back to rollout), not lost, and did not refuse a connection in the last
`unreachable_cooldown_s`.

Choice: the session's previous resource while it takes requests (sticky: its prefix cache holds the
session's history), else the one with the fewest requests in flight from this proxy (then the fewest
dispatched, then registration order).

`epoch` of a resource goes up each time it becomes usable again (registered, resumed, back to
rollout activity); a call that was aborted on a resource avoids it until its epoch moved, so a call
preempted on A is continued elsewhere even before the PauseRollout event for A arrived.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.events import (
    Event,
    PauseRollout,
    Preemption,
    ResourceLost,
    ResourceRegistered,
    ResumeRollout,
    TagKind,
    TagTransition,
)

ROLLOUT = "rollout"
_STICKY_LIMIT = 100_000


@dataclass
class ResourceState:
    resource_id: str
    endpoint: str = ""
    order: int = 0
    static: bool = False
    capabilities: frozenset[str] | None = None  # None: unknown (static endpoint) = rollout-capable
    activity: str | None = None  # None: unknown (static endpoint) = rolling out
    paused: bool = False
    pause_mode: str = ""
    preempted: bool = False
    lost: bool = False
    unreachable_until: float = 0.0
    epoch: int = 0
    inflight: int = 0
    dispatched: int = 0

    def usable(self, now: float) -> bool:
        return (
            bool(self.endpoint)
            and (self.capabilities is None or ROLLOUT in self.capabilities)
            and (self.activity is None or self.activity == ROLLOUT)
            and not (self.paused or self.preempted or self.lost)
            and now >= self.unreachable_until
        )

    def why_not(self, now: float) -> str:
        if not self.endpoint:
            return "no endpoint"
        if self.lost:
            return "lost"
        if self.capabilities is not None and ROLLOUT not in self.capabilities:
            return "no rollout capability"
        if self.paused:
            return f"paused ({self.pause_mode or 'in_place'})"
        if self.preempted:
            return "preempted"
        if self.activity is not None and self.activity != ROLLOUT:
            return f"activity {self.activity}"
        if now < self.unreachable_until:
            return "unreachable"
        return "usable"


@dataclass(frozen=True)
class Lease:
    """A resource taken for one engine request; give it back with `RoutingTable.release`."""

    resource_id: str
    endpoint: str
    epoch: int


class RoutingTable:
    """Thread-safe: events arrive on the consumer thread, picks happen on the event loop."""

    def __init__(self, *, sticky: bool = True, unreachable_cooldown_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sticky = sticky
        self.unreachable_cooldown_s = unreachable_cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._resources: dict[str, ResourceState] = {}
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._listeners: list[Callable[[], None]] = []
        self.events_applied = 0

    # ----- state changes

    def add_static(self, resource_id: str, endpoint: str) -> None:
        with self._lock:
            state = self._state(resource_id)
            state.endpoint, state.static = endpoint, True
        self._notify()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """`listener()` runs after every change (on the thread that made it)."""
        self._listeners.append(listener)

    def apply(self, event: Event) -> bool:
        """Applies a resources / scheduler / control event; False if it does not concern routing."""
        with self._lock:
            changed = self._apply(event)
            if changed:
                self.events_applied += 1
        if changed:
            self._notify()
        return changed

    def _apply(self, event: Event) -> bool:
        if isinstance(event, ResourceRegistered):
            state = self._state(event.resource_id)
            state.endpoint = event.endpoint.rstrip("/") or state.endpoint
            state.capabilities = frozenset(event.capabilities)
            if state.activity is None and not state.static:
                state.activity = "idle"
            state.lost, state.unreachable_until = False, 0.0
            state.epoch += 1
        elif isinstance(event, ResourceLost):
            self._state(event.resource_id).lost = True
        elif isinstance(event, TagTransition):
            state = self._state(event.resource_id)
            if event.tag_kind == TagKind.CAPABILITY:
                state.capabilities = frozenset(event.to_tags)
            else:
                state.activity = event.to_tags[0] if event.to_tags else "idle"
                if state.activity == ROLLOUT:
                    state.preempted = False
                    state.epoch += 1
        elif isinstance(event, Preemption):
            self._state(event.resource_id).preempted = True
        elif isinstance(event, PauseRollout):
            state = self._state(event.resource_id)
            state.paused, state.pause_mode = True, str(event.mode)
        elif isinstance(event, ResumeRollout):
            state = self._state(event.resource_id)
            state.paused, state.pause_mode, state.preempted = False, "", False
            state.epoch += 1
        else:
            return False
        return True

    def mark_unreachable(self, resource_id: str) -> None:
        """The resource refused a connection (or died mid-call): skip it for the cooldown."""
        with self._lock:
            if resource_id in self._resources:
                self._resources[resource_id].unreachable_until = self._clock() + self.unreachable_cooldown_s
        self._notify()

    def _state(self, resource_id: str) -> ResourceState:
        state = self._resources.get(resource_id)
        if state is None:
            state = self._resources[resource_id] = ResourceState(resource_id, order=len(self._resources))
        return state

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    # ----- picking

    def acquire(self, session_id: str, avoid: Mapping[str, int] | None = None, *,
                allow_avoided: bool = False) -> Lease | None:
        """Takes a usable resource for one request of `session_id`, or None when there is none.

        `avoid` maps resource ids to the epoch at which a call was aborted there; those are skipped
        until their epoch moved, unless `allow_avoided` (nothing else is usable for a while).
        """
        avoid = avoid or {}
        with self._lock:
            now = self._clock()
            usable = [r for r in self._resources.values() if r.usable(now)]
            preferred = [r for r in usable if avoid.get(r.resource_id) != r.epoch]
            candidates = preferred or (usable if allow_avoided else [])
            if not candidates:
                return None
            chosen = None
            if self.sticky:
                previous = self._resources.get(self._sessions.get(session_id, ""))
                if previous is not None and previous in candidates:
                    chosen = previous
            if chosen is None:
                chosen = min(candidates, key=lambda r: (r.inflight, r.dispatched, r.order))
            chosen.inflight += 1
            chosen.dispatched += 1
            if self.sticky:
                self._sessions[session_id] = chosen.resource_id
                self._sessions.move_to_end(session_id)
                if len(self._sessions) > _STICKY_LIMIT:
                    self._sessions.popitem(last=False)
            return Lease(chosen.resource_id, chosen.endpoint, chosen.epoch)

    def release(self, lease: Lease) -> None:
        with self._lock:
            state = self._resources.get(lease.resource_id)
            if state is not None and state.inflight > 0:
                state.inflight -= 1

    def forget_session(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    # ----- views

    def usable_ids(self) -> list[str]:
        with self._lock:
            now = self._clock()
            return [r.resource_id for r in self._resources.values() if r.usable(now)]

    def epoch_of(self, resource_id: str) -> int:
        with self._lock:
            state = self._resources.get(resource_id)
            return -1 if state is None else state.epoch

    def describe_unavailable(self) -> str:
        """Why no resource takes requests, for the 503 message."""
        with self._lock:
            now = self._clock()
            if not self._resources:
                return "no rollout resource is known (no static endpoint, no ResourceRegistered event)"
            return "; ".join(f"{r.resource_id}: {r.why_not(now)}" for r in self._resources.values())

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            now = self._clock()
            return [
                {
                    "resource_id": r.resource_id,
                    "endpoint": r.endpoint,
                    "static": r.static,
                    "capabilities": sorted(r.capabilities) if r.capabilities is not None else None,
                    "activity": r.activity,
                    "state": r.why_not(now),
                    "epoch": r.epoch,
                    "inflight": r.inflight,
                    "dispatched": r.dispatched,
                }
                for r in self._resources.values()
            ]
