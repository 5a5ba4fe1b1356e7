"""The scheduler's Prometheus series (`bus.metrics.CATALOG`): read from its state when Prometheus scrapes,
except the weight-sync pause, observed when the scheduler publishes a WeightSyncCompleted.

The state is read from another thread than the one that changes it: each reading copies what it needs
(a dict copy is atomic under the GIL), so a scrape sees a state at most one decision old.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from bus.metrics import ServiceMetrics
from scheduler_svc.journal import JournaledScheduler
from schemas import events as ev


def export(metrics: ServiceMetrics, current: Callable[[], JournaledScheduler]) -> None:
    """Registers the scheduler's scrape-time series; `current` gives the scheduler (a recovery replaces it)."""

    def tags() -> dict[tuple[str, ...], int]:
        out: dict[tuple[str, ...], int] = {}
        for rid, resource in dict(current().core.pool.resources).items():
            if not resource.alive:
                continue
            out[(rid, "activity", resource.activity)] = 1
            out.update({(rid, "capability", tag): 1 for tag in resource.capabilities})
        return out

    def groups() -> dict[tuple[str, ...], int]:
        loader = current().core.loader
        return {("open",): len(loader.groups), ("ready",): len(loader.ready)}

    metrics.read("sflow_scheduler_resource_tag", tags)
    metrics.read("sflow_scheduler_groups", groups)
    metrics.read("sflow_scheduler_decisions_total", lambda: current().event_seq)
    metrics.read("sflow_scheduler_policy_version", lambda: current().core.version)


class SyncPauses:
    """Observes each weight sync's pause: from its WeightSyncStarted to its WeightSyncCompleted (event times)."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._histogram = metrics.histogram("sflow_weight_sync_pause_seconds")
        self._started_ms: dict[str, int] = {}

    def saw(self, events: Iterable[ev.Event]) -> None:
        for e in events:
            if isinstance(e, ev.WeightSyncStarted):
                self._started_ms[e.sync_id] = e.ts_ms
            elif isinstance(e, ev.WeightSyncCompleted) and e.sync_id in self._started_ms:
                self._histogram.observe(max(0, e.ts_ms - self._started_ms.pop(e.sync_id)) / 1000)
