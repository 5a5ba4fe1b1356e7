"""The resource pool, the scheduler's decisions about it, and the scheduler's journal.

Topics `resources`, `scheduler` (docs/architecture.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from schemas.envelope import Event


class TagKind(enum.StrEnum):
    CAPABILITY = "capability"  # what a resource may do (rollout, train, reference, critic)
    ACTIVITY = "activity"  # what it does right now (idle, rollout, train, ...)


@dataclass(frozen=True, kw_only=True)
class ResourceRegistered(Event):
    resource_id: str
    endpoint: str
    device_kind: str
    num_devices: int = 1
    memory_bytes: int
    hbm_bandwidth: float
    peak_flops: float
    capabilities: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Event):
    resource_id: str
    activity: str
    weight_version: int
    running_requests: int
    queued_requests: int
    tokens_generated: int

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class ResourceLost(Event):
    resource_id: str
    reason: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class TagTransition(Event):
    resource_id: str
    tag_kind: TagKind
    from_tags: tuple[str, ...] = ()
    to_tags: tuple[str, ...] = ()
    cause: str
    reason: str = ""

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class Preemption(Event):
    resource_id: str
    preempted_task: str
    by_task: str
    assignment_id: str
    reason: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class Assignment(Event):
    assignment_id: str
    task_kind: str
    resource_ids: tuple[str, ...] = ()
    step: int
    policy_version: int
    payload: str = "{}"

    @property
    def key(self) -> str:
        return self.resource_ids[0] if self.resource_ids else self.assignment_id


@dataclass(frozen=True, kw_only=True)
class SchedulerObserved(Event):
    run_id: str
    seq: int
    source_topic: str = ""
    source_partition: int = -1
    source_offset: int = -1
    input: str
    observations: str
    event_seq: int
    num_events: int

    @property
    def key(self) -> str:
        return self.run_id


@dataclass(frozen=True, kw_only=True)
class SchedulerCheckpoint(Event):
    run_id: str
    observed_seq: int
    event_seq: int
    config: str
    state_sha256: str = ""
    state: str = ""

    @property
    def key(self) -> str:
        return self.run_id
