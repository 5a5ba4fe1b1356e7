"""Dynamic sampling's refill, the scheduler's part: how many groups a step takes when the trainer filters
the groups whose samples all got one reward (plain functions; `RolloutManager.batch_groups` uses them)."""

from __future__ import annotations

import math
from collections.abc import Sequence

#: steps whose filtered share sizes the next batch, and the share it assumes at most
FILTER_WINDOW_STEPS, MAX_FILTERED_SHARE = 3, 0.75


def refill_groups(batch_groups: int, extra_groups: int, filtered_shares: Sequence[float]) -> int:
    """B, or as many more groups as leave B with reward variance at the recent filtered share, at most
    B + `extra_groups` (0: no refill)."""
    if not extra_groups or not filtered_shares:
        return batch_groups
    share = min(MAX_FILTERED_SHARE, sum(filtered_shares) / len(filtered_shares))
    return min(batch_groups + extra_groups, math.ceil(batch_groups / (1.0 - share) - 1e-9))


def recent_shares(filtered_shares: Sequence[float], filtered: int, fed: int) -> list[float]:
    """The window of filtered shares after a step that was fed `fed` groups and filtered `filtered`."""
    return [*filtered_shares, min(1.0, filtered / fed)][-FILTER_WINDOW_STEPS:]
