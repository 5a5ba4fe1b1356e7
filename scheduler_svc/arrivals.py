"""When the groups a train step waits for will be complete, read from how long each has been rolling
out against the latencies (dispatch to completion) of the groups completed lately.

A production rate cannot tell a batch's long tail (its last groups, long in flight, come much slower
than the rate) from a fresh start; the groups' ages can: a group `a` seconds in is one of the
latencies longer than `a`, and is done within `h` with the share of those that ended by `a + h`.
Used by the adaptive lending rules (`scheduler_svc.lending`) for the stragglers' rest.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

#: fewest observed latencies before the stragglers' rest is read from them (else from the rate)
MIN_LATENCIES = 8
#: bisections of the arrival horizon (of the longest latency: 2^-20 of it is well under a second)
ARRIVAL_BISECTIONS = 20


def _done_within(lats: Sequence[float], ages: Sequence[float], horizon: float) -> float:
    """Expected count of the groups of these `ages` complete within `horizon` seconds, each by the
    observed latencies (sorted) longer than its age; one older than all of them is due now."""
    count = 0.0
    n = len(lats)
    for age in ages:
        longer = n - bisect.bisect_right(lats, age)
        if longer == 0:
            count += 1.0
            continue
        count += (bisect.bisect_right(lats, age + horizon) - (n - longer)) / longer
    return count


def _horizon(lats: Sequence[float], ages: Sequence[float], wanted: float) -> float:
    """Shortest horizon within which `wanted` of the groups of these `ages` are expected complete."""
    if wanted <= 0 or not ages:
        return 0.0
    lo, hi = 0.0, lats[-1]
    for _ in range(ARRIVAL_BISECTIONS):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _done_within(lats, ages, mid) >= wanted else (mid, hi)
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
    lats = sorted(latencies)
    pool = list(ages) + [0.0] * max(0, missing - len(ages))
    return max(_horizon(lats, pool, missing - 0.5), _horizon(lats, barrier, len(barrier) - 0.5))
