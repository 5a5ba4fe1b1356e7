"""The core's decisions carried out on the simulated cluster, as the Kafka shell's consumers would
(the proxy for TaskDispatched/TaskAborted, the engines for Pause/Load/Resume, the trainer for
Assignment/TrainData/Preemption)."""

from __future__ import annotations

import heapq

from scheduler_svc.decisions import (
    Assignment,
    LoadWeights,
    PauseRollout,
    Preemption,
    ResumeRollout,
    TagTransition,
    TaskAborted,
    TaskDispatched,
    TrainData,
    WeightsLoaded,
)
from scheduler_svc.sim.faults import Faults
from scheduler_svc.sim.records import Device, DeviceMode, DeviceRole, Group, Seq, StepStats, TrainJob
from scheduler_svc.sim.results import Activity
from scheduler_svc.sim.world import SimEvent
from scheduler_svc.tags import ACTIVITY, IDLE, TRAIN


class DecisionHandlers(Faults):
    """One handler per decision type; `decision_handlers` is the table `_observe` dispatches on."""

    def _on_dispatched(self, d: TaskDispatched) -> None:
        # a re-generation samples the same prompt again: fresh responses, not the aborted ones
        salt = d.attempt * d.n_samples
        specs = [self.workload.sample(d.position, salt + i) for i in range(d.n_samples)]
        group = Group(d.group_id, d.position, specs, d.policy_version)
        self.groups[d.group_id] = group
        for i, spec in enumerate(specs):
            seq = Seq(next(self._uid), group, i, spec)
            group.seqs.append(seq)
            self._route(seq)

    def _on_aborted(self, d: TaskAborted) -> None:
        """The group is past the staleness bound: cancel its sessions wherever they are (running,
        queued, in a tool call) and discard everything it generated."""
        group = self.groups.pop(d.group_id, None)
        if group is None:
            return
        self.aborted_groups += 1
        self.dropped_groups += not d.regenerate
        wasted = 0
        touched: set[int] = set()
        for seq in group.seqs:
            seq.dead = True
            if seq.home >= 0:
                dev = self.devices[seq.home]
                if seq.uid in dev.running:
                    self._advance(dev)
                    self._leave(dev, seq, dev.K - seq.k_admit)
                    touched.add(dev.idx)
            wasted += seq.generated
        if self.window_start is not None and self.now >= self.window_start:
            self.wasted_tokens += wasted
        for dev in self.devices:
            if dev.idx in touched:
                dev.heap = [e for e in dev.heap if not e[2].dead]
                heapq.heapify(dev.heap)
            if any(e[2].dead for e in dev.local):
                dev.local = [e for e in dev.local if not e[2].dead]
                heapq.heapify(dev.local)
                touched.add(dev.idx)
        if any(e[2].dead for e in self.global_queue):
            self.global_queue = [e for e in self.global_queue if not e[2].dead]
            heapq.heapify(self.global_queue)
        for idx in sorted(touched):
            dev = self.devices[idx]
            self.dirty.add(idx)
            self._fill(dev)

    def _device(self, rid: str) -> Device | None:
        dev = self.by_rid[rid]
        return None if dev.mode == DeviceMode.OFFLINE else dev

    def _on_pause(self, d: PauseRollout) -> None:
        dev = self._device(d.resource_id)
        if dev is None:
            return
        if d.mode == "abort":
            self._abort(dev)
        elif dev.mode == DeviceMode.ROLLOUT:
            self._set_mode(dev, DeviceMode.PAUSED, Activity.WEIGHT_SYNC)
            self._book_before_swap(dev)

    def _on_load(self, d: LoadWeights) -> None:
        dev = self._device(d.resource_id)
        if dev is None:
            return
        seconds = self.config.weight_sync_s + (self.config.switch_s if dev.role == DeviceRole.TRAIN else 0.0)
        if dev.mode != DeviceMode.PAUSED:
            self._set_mode(dev, DeviceMode.LOADING, Activity.WEIGHT_SYNC)
        self._book_before_swap(dev)
        dev.version = d.version  # what it generates with once it resumes
        dev.role = DeviceRole.ROLLOUT
        dev.cache_epoch += 1
        self._push(self.now + seconds, SimEvent.LOADED, dev.idx, d.version)

    def _ev_loaded(self, idx: int, version: int) -> None:
        dev = self.devices[idx]
        if dev.mode != DeviceMode.OFFLINE:
            self._observe(WeightsLoaded(self.now, dev.rid, version))

    def _on_resume(self, d: ResumeRollout) -> None:
        dev = self._device(d.resource_id)
        if dev is None:
            return
        self._advance(dev)
        dev.mode = DeviceMode.ROLLOUT
        dev.state = Activity.ROLLOUT
        dev.role = DeviceRole.ROLLOUT
        dev.stall_until = self.now + dev.stall_left
        dev.stall_left = 0.0
        if dev.running and self.config.reprefill_on_weight_sync:
            # partial rollout: the running requests continue from their tokens, re-prefilled with
            # the new weights (their old KV cache was computed by the old policy)
            seconds = 0.0
            for seq in dev.running.values():
                ctx = seq.ctx + (dev.K - seq.k_admit)
                seconds += dev.perf.prefill_time(ctx, 0.0)
                seq.cache_epoch = dev.cache_epoch
            dev.stall_until += seconds
            dev.stall_overhead += seconds
        dev.stamp += 1
        self.dirty.add(dev.idx)
        self._fill(dev)

    def _on_assignment(self, d: Assignment) -> None:
        if d.task_kind != TRAIN:
            return
        devices = [self.by_rid[rid] for rid in d.resource_ids]
        switching = any(dev.role == DeviceRole.ROLLOUT for dev in devices)
        job = TrainJob(d.assignment_id, d.step or 0, devices, next(self._seq))
        for dev in devices:
            if dev.mode == DeviceMode.OFFLINE:
                job.stalled = True
                continue
            self._set_mode(dev, DeviceMode.TRAIN, Activity.SWITCH if switching else Activity.TRAIN_BUBBLE)
            dev.role = DeviceRole.TRAIN
        self.job = job
        self.step_stats[d.assignment_id] = StepStats(job.step)
        if switching:
            self._push(self.now + self.config.switch_s, SimEvent.TRAIN_READY, job.token)
        else:
            job.ready = True

    def _on_train_data(self, d: TrainData) -> None:
        stats = self.step_stats.get(d.assignment_id)
        if stats is not None:
            stats.lags.extend(d.step - v for v in d.group_versions)
            for gid in d.group_ids:
                group = self.groups[gid]
                stats.samples += len(group.specs)
                stats.tokens += sum(s.generated_tokens for s in group.specs)
                for v, n in group.token_versions.items():  # the engines' record, not the core's
                    stats.token_lags[d.step - v] += n
        job = self.job
        if job is None or job.aid != d.assignment_id:
            return
        job.chunks.append(d.group_ids)
        job.final = job.final or d.final
        self._train_progress()

    def _on_preemption(self, d: Preemption) -> None:
        job = self.job
        if d.task_kind != TRAIN or job is None or job.aid != d.assignment_id:
            return
        self.job = None
        for dev in job.devices:
            if dev.mode != DeviceMode.OFFLINE:
                self._set_mode(dev, DeviceMode.IDLE, Activity.IDLE)

    def _on_tag(self, d: TagTransition) -> None:
        if d.tag_kind != ACTIVITY or d.to_tags != (IDLE,):
            return
        dev = self._device(d.resource_id)
        if dev is not None and dev.mode in (DeviceMode.TRAIN, DeviceMode.IDLE, DeviceMode.LOADING):
            self._set_mode(dev, DeviceMode.IDLE, Activity.IDLE)
