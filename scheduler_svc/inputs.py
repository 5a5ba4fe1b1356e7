"""The inputs of the scheduler service: the compact facts it uses from each consumed event.

Facts are small JSON-able dicts ({"kind": ..., "t": ..., ...}); they are what the journal records,
so a rebuild derives the same observations without the original events. Which event gives which
facts is listed in the `scheduler_svc.journal` module docstring.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import numpy as np

from scheduler_svc.errors import ConfigError
from scheduler_svc.roofline import DEVICE_PRESETS, DeviceSpec
from schemas import events as ev

TICK = "tick"


def device_of(event: ev.ResourceRegistered) -> DeviceSpec:
    """The roofline spec of a registering resource: its declared per-device numbers times
    `num_devices`, or the preset of its device kind when it declared none."""
    count = max(event.num_devices, 1)
    if event.peak_flops > 0 and event.hbm_bandwidth > 0 and event.memory_bytes > 0:
        spec = DeviceSpec(event.device_kind or "unknown", event.peak_flops / 1e12, event.hbm_bandwidth / 1e12,
                          event.memory_bytes / 1e9)
    elif event.device_kind in DEVICE_PRESETS:
        spec = DEVICE_PRESETS[event.device_kind]
    else:
        raise ConfigError(
            f"ResourceRegistered of {event.resource_id!r}: peak_flops={event.peak_flops!r}, hbm_bandwidth="
            f"{event.hbm_bandwidth!r}, memory_bytes={event.memory_bytes!r} and no preset for device_kind="
            f"{event.device_kind!r} (presets: {sorted(DEVICE_PRESETS)})"
        )
    return spec.scaled(count)


def token_versions_of(trajectory: ev.Trajectory) -> list[list[int]]:
    """[[version, generated tokens], ...] of a trajectory: its loss-masked tokens by policy version."""
    counts: Counter[int] = Counter()
    for node in trajectory.nodes:
        mask = np.asarray(node.loss_mask, dtype=bool)
        versions = np.asarray(node.versions)
        if len(mask) != len(versions):
            continue  # a node without per-token versions
        values, n = np.unique(versions[mask], return_counts=True)
        for v, c in zip(values.tolist(), n.tolist(), strict=True):
            if v >= 0:
                counts[v] += c
    return [[v, counts[v]] for v in sorted(counts)]


class EventInputs:
    """Reads the facts of consumed events for one run (own decisions and other runs are no input)."""

    producer: str
    run_id: str
    model: str

    def input_of(self, event: ev.Event) -> dict[str, Any] | None:
        """The facts of `event` the scheduler uses, as compact JSON-able data; None if it is no input.

        Raises `ConfigError` for an input it cannot use (a poison message: dead-letter it).
        """
        if event.producer == self.producer:
            return None  # the scheduler's own decisions (ResourceLost on `resources`, ...)
        t = event.ts_ms / 1000.0
        if isinstance(event, ev.ResourceRegistered):
            device = dataclasses.asdict(device_of(event))
            return {"kind": "registered", "t": t, "resource_id": event.resource_id, "device": device}
        if isinstance(event, ev.Heartbeat):
            return {"kind": "heartbeat", "t": t, "resource_id": event.resource_id}
        if isinstance(event, ev.ResourceLost):
            return {"kind": "down", "t": t, "resource_id": event.resource_id, "reason": event.reason or "reported_down"}
        if isinstance(event, ev.Trajectory):
            if not event.group_id:
                return None
            versions = token_versions_of(event)
            return {"kind": "trajectory", "t": t, "group_id": event.group_id, "trajectory_id": event.trajectory_id,
                    "reward": event.reward, "token_versions": versions}
        if isinstance(event, ev.BatchReady):
            return {"kind": "batch", "t": t, "group_id": event.group_id,
                    "trajectory_ids": list(event.trajectory_ids), "num_samples": event.num_samples}
        if isinstance(event, ev.WeightsPublished):
            if self.model and event.model != self.model:
                return None
            return {"kind": "published", "t": t, "version": event.version, "uri": event.uri,
                    "sha256": event.sha256, "step": event.step}
        if isinstance(event, ev.TrainStepCompleted):
            if event.run_id != self.run_id:
                return None
            if event.status == "skipped":
                return {"kind": "step_skipped", "t": t, "step": event.step, "assignment_id": event.correlation_id,
                        "reason": event.reason}
            done = {"kind": "step_done", "t": t, "step": event.step, "version": event.new_version,
                    "assignment_id": event.correlation_id}
            if event.filtered_group_ids or event.added_group_ids:  # dynamic sampling (absent: older journals)
                done |= {"filtered": len(event.filtered_group_ids), "added": list(event.added_group_ids)}
            return done
        if isinstance(event, ev.WeightsLoaded):
            return {"kind": "loaded", "t": t, "resource_id": event.resource_id, "version": event.version}
        if isinstance(event, ev.ControlAck):
            if event.command != "LoadWeights":
                return None
            return {"kind": "ack", "t": t, "resource_id": event.resource_id, "command_id": event.command_id,
                    "ok": event.ok, "error": event.error}
        return None

    @staticmethod
    def tick_input(t: float) -> dict[str, Any]:
        return {"kind": TICK, "t": t}
