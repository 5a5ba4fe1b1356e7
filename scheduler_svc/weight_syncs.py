"""Weight-sync groups in flight: which resources load which version, and which still owe an ack.

A sync group resumes its members together once every one of them acknowledged its load
(`RolloutManager.finish_weight_syncs`); a member that leaves (lost, resumed, moved out of
`weight_sync`) no longer holds the others back. State changes only through `apply`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler_svc.decisions import (
    LoadWeights,
    Record,
    ResourceLost,
    ResumeRollout,
    TagTransition,
    WeightsLoaded,
    WeightSyncCompleted,
    WeightSyncStarted,
)
from scheduler_svc.tags import ACTIVITY, WEIGHT_SYNC


@dataclass
class SyncState:
    version: int
    members: list[str] = field(default_factory=list)
    pending: set[str] = field(default_factory=set)

    def snapshot(self) -> dict[str, Any]:
        return {"version": self.version, "members": tuple(self.members), "pending": tuple(sorted(self.pending))}


class WeightSyncLedger:
    def __init__(self) -> None:
        self.serving_version = 0  # latest version a fleet-wide weight sync was started for
        self.syncs: dict[str, SyncState] = {}
        self.resource_sync: dict[str, str] = {}
        self.next_sync_seq = 0

    def new_sync_id(self) -> str:
        return f"sync{self.next_sync_seq}"

    def load_pending(self, resource_id: str) -> bool:
        """Whether the resource was told to load weights and has not acknowledged it yet."""
        sync = self.syncs.get(self.resource_sync.get(resource_id, ""))
        return sync is not None and resource_id in sync.pending

    def apply(self, record: Record) -> None:
        handler = _APPLY.get(type(record))
        if handler is not None:
            handler(self, record)

    def leave(self, resource_id: str) -> None:
        sync_id = self.resource_sync.pop(resource_id, None)
        if sync_id is None:
            return
        sync = self.syncs.get(sync_id)
        if sync is None:
            return
        if resource_id in sync.members:
            sync.members.remove(resource_id)
        sync.pending.discard(resource_id)
        if not sync.members:
            del self.syncs[sync_id]

    def _apply_sync_started(self, d: WeightSyncStarted) -> None:
        self.next_sync_seq += 1
        self.serving_version = max(self.serving_version, d.version)
        if d.resource_ids:
            self.syncs[d.sync_id] = SyncState(d.version)

    def _apply_load(self, d: LoadWeights) -> None:
        if self.resource_sync.get(d.resource_id) != d.sync_id:
            self.leave(d.resource_id)
        sync = self.syncs.setdefault(d.sync_id, SyncState(d.version))
        if d.resource_id not in sync.members:
            sync.members.append(d.resource_id)
        sync.pending.add(d.resource_id)
        self.resource_sync[d.resource_id] = d.sync_id

    def _apply_loaded(self, obs: WeightsLoaded) -> None:
        sync_id = self.resource_sync.get(obs.resource_id)
        if sync_id is None:
            return
        sync = self.syncs.get(sync_id)
        if sync is not None and sync.version == obs.version:
            sync.pending.discard(obs.resource_id)

    def _apply_sync_completed(self, d: WeightSyncCompleted) -> None:
        self.syncs.pop(d.sync_id, None)
        for rid in d.resource_ids:
            if self.resource_sync.get(rid) == d.sync_id:
                del self.resource_sync[rid]

    def _apply_tag(self, d: TagTransition) -> None:
        if d.tag_kind == ACTIVITY and d.from_tags == (WEIGHT_SYNC,):
            self.leave(d.resource_id)

    def _apply_resume(self, d: ResumeRollout) -> None:
        self.leave(d.resource_id)

    def _apply_lost(self, d: ResourceLost) -> None:
        self.leave(d.resource_id)

    def snapshot(self) -> dict[str, Any]:
        return {
            "serving_version": self.serving_version,
            "syncs": {sid: s.snapshot() for sid, s in self.syncs.items()},
            "resource_sync": dict(sorted(self.resource_sync.items())),
            "next_sync_seq": self.next_sync_seq,
        }


_APPLY: dict[type, Any] = {
    WeightSyncStarted: WeightSyncLedger._apply_sync_started,
    LoadWeights: WeightSyncLedger._apply_load,
    WeightsLoaded: WeightSyncLedger._apply_loaded,
    WeightSyncCompleted: WeightSyncLedger._apply_sync_completed,
    TagTransition: WeightSyncLedger._apply_tag,
    ResumeRollout: WeightSyncLedger._apply_resume,
    ResourceLost: WeightSyncLedger._apply_lost,
}
