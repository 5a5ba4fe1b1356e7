"""Engine physics: continuous-batching decode integrated analytically between events, prefill
stalls, KV reservations, and the activity record of each device.

A device's decode progress is brought up to `now` only when something touches it (`_advance`):
with b running sequences, the closed forms of `DevicePerf` give the iterations done in the
elapsed time, so the loop never steps per token.
"""

from __future__ import annotations

import heapq

from scheduler_svc.sim.records import Device, DeviceMode, Seq
from scheduler_svc.sim.results import Activity
from scheduler_svc.sim.world import SimEvent, SimWorld


class EnginePhysics(SimWorld):
    """Decode, prefill and KV accounting of each engine, and the time each device spends per activity."""

    def _segment(self, dev: Device, t0: float, t1: float, state: Activity) -> None:
        if t1 <= t0:
            return
        segs = dev.segments
        if segs and segs[-1][2] == state and abs(segs[-1][1] - t0) < 1e-9:
            segs[-1][1] = t1
        else:
            segs.append([t0, t1, state])

    def _close_segment(self, dev: Device, t: float) -> None:
        if dev.mode != DeviceMode.ROLLOUT:
            self._segment(dev, dev.last_t, t, dev.state)
            dev.last_t = max(dev.last_t, t)

    def _advance(self, dev: Device) -> None:
        """Bring a device to `now`: integrate decode progress and record what it did."""
        now = self.now
        t = dev.last_t
        if now <= t:
            return
        if dev.mode != DeviceMode.ROLLOUT:
            self._segment(dev, t, now, dev.state)
            dev.last_t = now
            return
        if dev.stall_until > t:
            s_end = min(now, dev.stall_until)
            overhead = min(s_end - t, dev.stall_overhead)
            dev.stall_overhead -= overhead
            self._segment(dev, t, t + overhead, Activity.REPREFILL)
            self._segment(dev, t + overhead, s_end, Activity.ROLLOUT)
            t = s_end
        if now > t:
            b = len(dev.running)
            if b:
                dk = dev.perf.steps_in(now - t, b, dev.C)
                dev.K += dk
                dev.C += b * dk
                self._segment(dev, t, now, Activity.ROLLOUT)
                if self.window_start is not None and now > self.window_start:
                    seconds = now - max(t, self.window_start)
                    self.decode_seconds += seconds
                    self.batch_seconds += b * seconds
            else:
                self._segment(dev, t, now, Activity.ROLLOUT_BUBBLE)
        dev.last_t = now

    def _reschedule(self, dev: Device) -> None:
        dev.epoch += 1
        if dev.mode != DeviceMode.ROLLOUT or not dev.heap:
            return
        self._advance(dev)
        steps = max(0.0, dev.heap[0][0] - dev.K)
        start = max(self.now, dev.stall_until)
        dt = dev.perf.time_for_steps(steps, len(dev.running), dev.C)
        self._push(start + dt, SimEvent.DEVICE, dev.idx, dev.epoch)

    def _fits(self, dev: Device, seq: Seq) -> bool:
        if len(dev.running) >= self.config.max_running_seqs:
            return False
        need = seq.ctx + seq.remaining
        return not dev.running or dev.reserved + need <= dev.kv_capacity

    def _admit(self, dev: Device, seq: Seq) -> None:
        self._advance(dev)
        if seq.home == dev.idx and seq.cache_epoch == dev.cache_epoch:
            prefill, overhead = seq.new_tokens, 0
        else:
            prefill, overhead = seq.ctx, seq.ctx - seq.new_tokens
        if prefill > 0:
            seconds = dev.perf.prefill_time(prefill, seq.ctx - prefill)
            dev.stall_until = max(self.now, dev.stall_until) + seconds
            if overhead > 0:
                dev.stall_overhead += seconds * overhead / prefill
        seq.new_tokens = 0
        seq.home = dev.idx
        seq.cache_epoch = dev.cache_epoch
        seq.k_admit = dev.K
        seq.reserved = seq.ctx + seq.remaining
        dev.reserved += seq.reserved
        dev.C += seq.ctx
        dev.running[seq.uid] = seq
        heapq.heappush(dev.heap, (dev.K + seq.remaining, seq.uid, seq))
        self.dirty.add(dev.idx)

    def _leave(self, dev: Device, seq: Seq, generated: float) -> None:
        """Take a sequence off its engine after `generated` more tokens of the current turn."""
        gen = round(min(max(generated, 0.0), seq.remaining))
        del dev.running[seq.uid]
        dev.C -= seq.ctx + (dev.K - seq.k_admit)
        dev.reserved -= seq.reserved
        seq.reserved = 0
        seq.ctx += gen
        seq.generated += gen
        seq.remaining -= gen
        self._attribute(dev, seq, gen)
        if not dev.running:
            dev.C = 0.0
            dev.reserved = 0

    @staticmethod
    def _attribute(dev: Device, seq: Seq, gen: int) -> None:
        """Book the `gen` tokens a residency kept: those counted at a weight sync under the version
        they were generated with, the rest under the engine's current one. (Fewer kept than counted
        only when a crash loses the turn: the oldest are kept, which never flatters staleness.)"""
        versions = seq.versions
        keep = gen
        if seq.pend_total:
            for v in sorted(seq.pend):
                take = min(seq.pend[v], keep)
                if take:
                    versions[v] = versions.get(v, 0) + take
                keep -= take
            seq.pend.clear()
            seq.pend_total = 0
        if keep > 0:
            versions[dev.version] = versions.get(dev.version, 0) + keep

    def _book_before_swap(self, dev: Device) -> None:
        """The engine is about to swap weights under its running requests (partial rollout): the
        tokens they generated so far carry the version being replaced."""
        self._advance(dev)
        for seq in dev.running.values():
            done = min(round(dev.K - seq.k_admit), seq.remaining)
            n = done - seq.pend_total
            if n > 0:
                seq.pend[dev.version] = seq.pend.get(dev.version, 0) + n
                seq.pend_total += n
