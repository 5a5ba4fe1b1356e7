"""Control commands to inference resources and the life of a policy version: published, synced, loaded.

Topics `control`, `weights` (docs/architecture.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from schemas.envelope import Event


class PauseMode(enum.StrEnum):
    ABORT = "abort"  # stop now, return partial outputs (preemption): the adapter resumes them elsewhere
    IN_PLACE = "in_place"  # keep running requests, continue them after the pause (weight sync)


@dataclass(frozen=True, kw_only=True)
class PauseRollout(Event):
    resource_id: str
    mode: PauseMode
    reason: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class ResumeRollout(Event):
    resource_id: str
    reason: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class LoadWeights(Event):
    resource_id: str
    version: int
    uri: str
    sha256: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class ControlAck(Event):
    resource_id: str
    command_id: str
    command: str
    ok: bool
    error: str = ""
    duration_ms: float = 0.0

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class WeightsPublished(Event):
    model: str
    version: int
    uri: str
    sha256: str
    step: int
    num_bytes: int = 0

    @property
    def key(self) -> str:
        return self.model


@dataclass(frozen=True, kw_only=True)
class WeightsLoaded(Event):
    model: str
    resource_id: str
    version: int
    pause_ms: float
    load_ms: float

    @property
    def key(self) -> str:
        return self.model


@dataclass(frozen=True, kw_only=True)
class WeightSyncStarted(Event):
    model: str
    sync_id: str
    version: int
    resource_ids: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.model


@dataclass(frozen=True, kw_only=True)
class WeightSyncCompleted(Event):
    model: str
    sync_id: str
    version: int
    resource_ids: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.model
