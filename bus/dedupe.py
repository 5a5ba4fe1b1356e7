"""Consumer-side deduplication: what turns at-least-once delivery into effectively-once processing.

Producers of derived events (the trajectory processor's Trajectory and BatchReady) give every copy
of one fact the same `event_id` (a uuid5 of the entity) and the same bytes, so a consumer that
processes each `event_id` once processes each fact once, however often a restarted producer
re-published it. `Deduplicator` remembers the ids it let through, bounded by count and by age.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from bus.errors import BusError
from schemas.events import Event

T = TypeVar("T")


def event_id_of(item: object) -> str:
    """The dedup key of an Event or of a `Received` wrapping one."""
    event = getattr(item, "event", item)
    if not isinstance(event, Event):
        raise BusError(f"cannot deduplicate a {type(item).__name__}: it is neither an Event nor holds one")
    return event.event_id


class Deduplicator:
    """Lets each key (default: the event id) through once.

    capacity: how many keys are remembered (the oldest are forgotten first).
    ttl_s: forget a key this long after it was first seen (None = only the capacity bounds memory).
        A duplicate arriving after its key was forgotten passes again, so both bounds must cover the
        longest redelivery gap (a producer's restart and replay of its uncommitted input).
    """

    def __init__(
        self,
        capacity: int = 1_000_000,
        ttl_s: float | None = None,
        key: Callable[[object], str] = event_id_of,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise BusError(f"capacity must be >= 1, got {capacity}")
        if ttl_s is not None and ttl_s <= 0:
            raise BusError(f"ttl_s must be > 0 or None, got {ttl_s}")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._key = key
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()
        self.passed = 0
        self.duplicates = 0

    def first_time(self, item: object) -> bool:
        """True the first time a key is seen (and records it); False for a duplicate."""
        now = self._clock()
        self._expire(now)
        k = self._key(item)
        if k in self._seen:
            self.duplicates += 1
            return False
        self._seen[k] = now
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        self.passed += 1
        return True

    def filter(self, items: Iterable[T]) -> Iterator[T]:
        """The items whose key was not seen before, in order."""
        return (item for item in items if self.first_time(item))

    def __len__(self) -> int:
        return len(self._seen)

    def _expire(self, now: float) -> None:
        if self.ttl_s is None:
            return
        horizon = now - self.ttl_s
        while self._seen:
            oldest_key, first_seen = next(iter(self._seen.items()))
            if first_seen > horizon:
                return
            del self._seen[oldest_key]
