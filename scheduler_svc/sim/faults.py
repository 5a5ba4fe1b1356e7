"""Faults and elasticity: an engine crashes (its current turns are lost, an SPMD step on it hangs),
the core is told after `failure_detect_s`; a device joins and registers."""

from __future__ import annotations

from typing import Any

from scheduler_svc.decisions import ResourceDown, ResourceRegistered
from scheduler_svc.roofline import device_preset
from scheduler_svc.sim.records import DeviceMode
from scheduler_svc.sim.results import Activity
from scheduler_svc.sim.trainer import TrainerModel
from scheduler_svc.sim.world import SimEvent


class Faults(TrainerModel):
    """Engine crashes, their detection, and devices joining."""

    def _ev_fail(self, idx: int, _: Any) -> None:
        dev = self.devices[idx]
        if dev.mode == DeviceMode.OFFLINE:
            return
        self._advance(dev)
        moved = []
        for seq in list(dev.running.values()):
            self._leave(dev, seq, 0.0)  # the turn being generated is lost with the engine
            moved.append(seq)
        dev.heap.clear()
        moved.extend(entry[2] for entry in dev.local)
        dev.local.clear()
        if self.job is not None and dev in self.job.devices:
            self.job.stalled = True  # an SPMD step hangs until the scheduler notices
        self._set_mode(dev, DeviceMode.OFFLINE, Activity.OFFLINE)
        for seq in moved:
            seq.home = -1
            self._route(seq)
        self._push(self.now + self.config.failure_detect_s, SimEvent.DETECT, dev.rid)

    def _ev_detect(self, rid: str, _: Any) -> None:
        self._observe(ResourceDown(self.now, rid, "engine_crashed"))

    def _ev_join(self, kind: str, _: Any) -> None:
        dev = self._add_device(device_preset(kind).scaled(self.config.engine_tp))
        dev.last_t = self.now
        self._observe(ResourceRegistered(self.now, dev.rid, dev.spec, None))
