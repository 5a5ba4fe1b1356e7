"""The agents' side of a rollout: a sequence finishing its turn, its tool call, its next turn
(sticky to the engine holding its prefix cache), and requests moved off a preempted engine."""

from __future__ import annotations

import heapq

from scheduler_svc.decisions import SampleCompleted
from scheduler_svc.sim.records import Device, DeviceMode, Seq
from scheduler_svc.sim.results import Activity
from scheduler_svc.sim.routing import Routing
from scheduler_svc.sim.world import SimEvent


class Sessions(Routing):
    """Turns, tool calls and preemption of the sessions running on the engines."""

    def _ev_device(self, idx: int, epoch: int) -> None:
        dev = self.devices[idx]
        if epoch != dev.epoch or dev.mode != DeviceMode.ROLLOUT:
            return
        self._advance(dev)
        heap = dev.heap
        if heap and heap[0][0] - dev.K < 1e-6 * (1.0 + dev.K):
            dev.C += len(dev.running) * max(0.0, heap[0][0] - dev.K)
            dev.K = max(dev.K, heap[0][0])
        tol = 1e-9 * (1.0 + dev.K)
        finished: list[Seq] = []
        while heap and heap[0][0] <= dev.K + tol:
            _, _, seq = heapq.heappop(heap)
            self._leave(dev, seq, seq.remaining)
            finished.append(seq)
        self._fill(dev)
        self.dirty.add(idx)
        for seq in finished:
            self._turn_done(seq)

    def _turn_done(self, seq: Seq) -> None:
        turns = seq.spec.turns
        turn = turns[seq.turn]
        seq.turn += 1
        if seq.turn >= len(turns):
            seq.group.token_versions.update(seq.versions)
            versions = tuple(sorted(seq.versions.items()))
            self._observe(SampleCompleted(self.now, seq.group.gid, seq.index, seq.generated, versions))
            return
        seq.remaining = turns[seq.turn].gen_tokens
        self._push(self.now + turn.tool_s, SimEvent.TOOL, seq, turn.obs_tokens)

    def _ev_tool(self, seq: Seq, obs_tokens: int) -> None:
        if seq.dead:
            return
        seq.ctx += obs_tokens
        seq.new_tokens += obs_tokens
        home = self.devices[seq.home] if seq.home >= 0 else None
        if home is not None and home.mode in (DeviceMode.ROLLOUT, DeviceMode.PAUSED):
            self._queue_at(home, seq)  # sticky: the session's prefix cache lives there
        else:
            seq.home = -1
            self._route(seq)

    def _abort(self, dev: Device) -> None:
        """Preemption: running requests return their partial outputs and continue elsewhere."""
        self._advance(dev)
        moved = []
        for seq in list(dev.running.values()):
            self._leave(dev, seq, dev.K - seq.k_admit)
            moved.append(seq)
        dev.heap.clear()
        moved.extend(entry[2] for entry in dev.local)
        dev.local.clear()
        dev.stall_overhead = 0.0
        dev.stall_until = self.now
        self._set_mode(dev, DeviceMode.IDLE, Activity.IDLE)
        dev.stall_left = 0.0
        for seq in moved:
            seq.home = -1
            self._route(seq)
