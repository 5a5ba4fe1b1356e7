"""When the groups a train step waits for will be complete, read from how long each has been rolling
out against the latencies (dispatch to completion) of the groups completed lately.

A production rate cannot tell a batch's long tail (its last groups, long in flight, come much slower
than the rate) from a fresh start; the groups' ages can: a group `a` seconds in is one of the
latencies longer than `a`, and is done within `h` with the share of those that ended by `a + h`.
Used by the adaptive lending rules (`scheduler_svc.lending`) for the stragglers' rest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: fewest observed latencies before the stragglers' rest is read from them (else from the rate)
MIN_LATENCIES = 8
#: bisections of the arrival horizon (of the longest latency: 2^-20 of it is well under a second)
ARRIVAL_BISECTIONS = 20


def _horizon(lats: np.ndarray, ages: Sequence[float], wanted: float) -> float:
    """Shortest horizon within which `wanted` of the groups of these `ages` are expected complete:
    each by the observed latencies (`lats`, sorted) longer than its age, one older than all of them
    due now. Vectorised over the ages: the adaptive policy asks on every completed group, and this
    was three quarters of a simulated spatiotemporal run's time as a loop."""
    if wanted <= 0 or not len(ages):
        return 0.0
    n = len(lats)
    age = np.asarray(ages, dtype=float)
    first = lats.searchsorted(age, "right")
    active = first < n
    due = float(np.count_nonzero(~active))
    rolling = age[active]
    done_before = first[active]
    share = 1.0 / (n - done_before)  # of the latencies longer than a group's age, each one's share
    lo, hi = 0.0, float(lats[-1])
    for _ in range(ARRIVAL_BISECTIONS):
        mid = (lo + hi) / 2
        within = due + float((lats.searchsorted(rolling + mid, "right") - done_before) @ share)
        lo, hi = (lo, mid) if within >= wanted else (mid, hi)
    return hi


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
    pool = list(ages) + [0.0] * max(0, missing - len(ages))
    return max(_horizon(lats, pool, missing - 0.5), _horizon(lats, barrier, len(barrier) - 0.5))
