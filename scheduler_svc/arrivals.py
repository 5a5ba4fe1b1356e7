"""When the groups a train step waits for will be complete, read from how long each has been rolling
out against the latencies (dispatch to completion) of the groups completed lately.

A production rate cannot tell a batch's long tail (its last groups, long in flight, come much slower
than the rate) from a fresh start; the groups' ages can: a group `a` seconds in is one of the
latencies longer than `a`, and is done within `h` with the share of those that ended by `a + h`.
Used by the adaptive lending rules (`scheduler_svc.lending`) for the stragglers' rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

#: fewest observed latencies before the stragglers' rest is read from them (else from the rate)
MIN_LATENCIES = 8
#: bisections of the arrival horizon (of the longest latency: 2^-20 of it is well under a second)
ARRIVAL_BISECTIONS = 20


class RollingOut:
    """The groups rolling out (`ages`) against the observed latencies (`lats`, sorted): how many are
    expected complete within a horizon. Each is one of the latencies longer than its age, and is done
    within `h` with the share of those that ended by `age + h`; one older than all of them is due now.
    Vectorised over the ages: the adaptive policy asks on every completed group, and this was three
    quarters of a simulated spatiotemporal run's time as a loop."""

    def __init__(self, lats: np.ndarray, ages: Sequence[float]) -> None:
        self.lats = lats
        age = np.asarray(ages, dtype=float)
        first = lats.searchsorted(age, "right")
        active = first < len(lats)
        self.due = float(np.count_nonzero(~active))
        self.rolling = age[active]
        self.done_before = first[active]
        self.share = 1.0 / (len(lats) - self.done_before)  # of the latencies longer than a group's age, each one's

    def done_within(self, horizon: float) -> float:
        """Expected number of these groups complete within `horizon` seconds."""
        ended = self.lats.searchsorted(self.rolling + horizon, "right") - self.done_before
        return self.due + float(ended @ self.share)


def _horizon(lats: np.ndarray, ages: Sequence[float], wanted: float) -> float:
    """Shortest horizon within which `wanted` of the groups of these `ages` are expected complete."""
    if wanted <= 0 or not len(ages):
        return 0.0
    groups = RollingOut(lats, ages)
    lo, hi = 0.0, float(lats[-1])
    for _ in range(ARRIVAL_BISECTIONS):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if groups.done_within(mid) >= wanted else (mid, hi)
    return hi


def _pool(ages: Sequence[float], missing: int) -> list[float]:
    """The ages of the groups a batch waits for: a group not dispatched yet counts as age 0."""
    return list(ages) + [0.0] * max(0, missing - len(ages))


def arrivals_within(latencies: Sequence[float], ages: Sequence[float], missing: int) -> Callable[[float], float] | None:
    """How many of the `missing` groups are expected complete within a horizon (a function of it),
    read as `arrival_s` reads them; None: too few latencies observed (then the rate decides)."""
    if len(latencies) < MIN_LATENCIES or missing <= 0:
        return None
    groups = RollingOut(np.sort(np.asarray(latencies, dtype=float)), _pool(ages, missing))
    return lambda horizon: min(float(missing), groups.done_within(horizon))


def arrival_s(
    latencies: Sequence[float], ages: Sequence[float], missing: int, barrier: Sequence[float] = ()
) -> float | None:
    """Seconds until `missing` more groups are complete, read from the groups rolling out (`ages`:
    how long each has) against the observed `latencies` of completed groups (a group's chance to be
    done within a horizon is the share of the latencies longer than its age that end within it): the
    horizon within which `missing` are expected done (a group not dispatched yet counts as age 0),
    and no less than the one within which all those the batch must wait for (`barrier`: the strict
    bound's stragglers) are, less half a group (even odds). None: too few latencies observed (then
    the rate decides)."""
    if len(latencies) < MIN_LATENCIES:
        return None
    lats = np.sort(np.asarray(latencies, dtype=float))
    return max(_horizon(lats, _pool(ages, missing), missing - 0.5), _horizon(lats, barrier, len(barrier) - 0.5))
