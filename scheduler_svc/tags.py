"""Tag vocabulary shared by the pool, the policies and the simulator.

Capability tags say what a resource may do; the single activity tag says what it does now. Task
kinds reuse the capability names, and a resource running a task carries the activity of the same name.
"""

from __future__ import annotations

ROLLOUT = "rollout"
TRAIN = "train"
REFERENCE = "reference"
CRITIC = "critic"

CAPABILITIES: frozenset[str] = frozenset({ROLLOUT, TRAIN, REFERENCE, CRITIC})
TASK_KINDS: frozenset[str] = CAPABILITIES

IDLE = "idle"
WEIGHT_SYNC = "weight_sync"
OFFLINE = "offline"

ACTIVITIES: frozenset[str] = frozenset({IDLE, ROLLOUT, TRAIN, REFERENCE, CRITIC, WEIGHT_SYNC, OFFLINE})

CAPABILITY = "capability"
ACTIVITY = "activity"
TAG_KINDS: frozenset[str] = frozenset({CAPABILITY, ACTIVITY})


def sorted_tags(tags: frozenset[str] | set[str]) -> tuple[str, ...]:
    """Canonical tuple form: decisions carry tags as sorted tuples so logs compare byte for byte."""
    return tuple(sorted(tags))
