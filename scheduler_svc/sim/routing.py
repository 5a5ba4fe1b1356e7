"""The capture proxy's routing as the simulator models it: requests are held until all simultaneous
events are applied, then sent to the least-loaded routable engine, where they wait in its queue;
a serving engine with room admits from its own queue (oldest first) or steals from the longest one.

Loads are advertised on heaps with stamps instead of being kept sorted: an entry whose stamp is
older than its engine's is stale and skipped when it reaches the top.
"""

from __future__ import annotations

import heapq

from scheduler_svc.sim.engines import EnginePhysics
from scheduler_svc.sim.records import ROUTABLE, Device, DeviceMode, Seq
from scheduler_svc.sim.results import Activity


class Routing(EnginePhysics):
    """Mode changes, the proxy's queue, each engine's waiting queue and work stealing."""

    def _set_mode(self, dev: Device, mode: DeviceMode, state: Activity) -> None:
        self._advance(dev)
        if dev.mode == DeviceMode.ROLLOUT and mode != DeviceMode.ROLLOUT:
            dev.stall_left = max(0.0, dev.stall_until - self.now)
            dev.stall_until = self.now
        dev.mode = mode
        dev.state = state
        dev.stamp += 1
        self.dirty.add(dev.idx)
        self._offer(dev)

    def _offer(self, dev: Device) -> None:
        """Advertise an engine's load to the router (engines loading weights for rollout count too)."""
        if dev.mode in ROUTABLE:
            dev.stamp += 1
            heapq.heappush(self.routes, (len(dev.running) + len(dev.local), dev.idx, dev.stamp))

    def _route(self, seq: Seq) -> None:
        """Hand a request to the proxy; it is routed once all simultaneous events are applied."""
        heapq.heappush(self.global_queue, (seq.order, seq.uid, seq))

    def _route_held(self) -> None:
        """The proxy sends each held request to the least-loaded rollout engine (engines loading
        weights for rollout count); it waits in that engine's queue. With no such engine, it keeps
        holding the request (the long request of the capture proxy)."""
        routes = self.routes
        queue = self.global_queue
        while queue and routes:
            _, idx, stamp = routes[0]
            dev = self.devices[idx]
            if stamp != dev.stamp or dev.mode not in ROUTABLE:
                heapq.heappop(routes)
                continue
            self._queue_at(dev, heapq.heappop(queue)[2])

    def _queue_at(self, dev: Device, seq: Seq) -> None:
        heapq.heappush(dev.local, (seq.order, seq.uid, seq))
        self._fill(dev)

    def _note_backlog(self, dev: Device) -> None:
        """Advertise a serving engine's waiting queue to idle engines (work stealing)."""
        dev.qstamp += 1
        if dev.local and dev.mode == DeviceMode.ROLLOUT:
            heapq.heappush(self.backlog, (-len(dev.local), dev.idx, dev.qstamp))

    def _steal(self, thief: Device) -> Seq | None:
        """Work stealing: a request still waiting in the longest queue of a full serving engine (not
        started there, so it holds no KV) moves to an engine with room; the thief pays any lost
        prefix cache. Paused or loading engines are not robbed: they resume within seconds."""
        backlog = self.backlog
        while backlog:
            _, idx, qstamp = backlog[0]
            victim = self.devices[idx]
            if qstamp != victim.qstamp or victim.mode != DeviceMode.ROLLOUT or not victim.local or victim is thief:
                heapq.heappop(backlog)
                continue
            if not self._fits(thief, victim.local[0][2]):
                return None
            seq = heapq.heappop(victim.local)[2]
            self._note_backlog(victim)
            self._offer(victim)
            return seq
        return None

    def _fill(self, dev: Device) -> None:
        """A serving engine admits queued requests (oldest first) while it has room."""
        if dev.mode == DeviceMode.ROLLOUT:
            local = dev.local
            while local and self._fits(dev, local[0][2]):
                self._admit(dev, heapq.heappop(local)[2])
            while not local and self.backlog and len(dev.running) < self.config.max_running_seqs:
                seq = self._steal(dev)
                if seq is None:
                    break
                self._admit(dev, seq)
        self._note_backlog(dev)
        self._offer(dev)
