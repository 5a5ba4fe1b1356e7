"""The SPMD trainer: a step starts once its devices switched roles, trains each micro-batch as it
arrives (`TrainData` chunks), then runs the optimizer and reports the step to the core."""

from __future__ import annotations

from typing import Any

from scheduler_svc.decisions import TrainStepCompleted
from scheduler_svc.sim.model import train_time
from scheduler_svc.sim.records import DeviceMode, TrainJob
from scheduler_svc.sim.results import Activity
from scheduler_svc.sim.sessions import Sessions
from scheduler_svc.sim.world import SimEvent


class TrainerModel(Sessions):
    """The running train step's progress through its chunks and its optimizer step."""

    def _train_states(self, job: TrainJob, state: Activity) -> None:
        for dev in job.devices:
            if dev.mode == DeviceMode.TRAIN and dev.state != state:
                self._set_mode(dev, DeviceMode.TRAIN, state)

    def _train_progress(self) -> None:
        job = self.job
        if job is None or not job.ready or job.busy or job.stalled:
            return
        if job.chunks:
            chunk = job.chunks.popleft()
            lengths = [spec.total_tokens for gid in chunk for spec in self.groups[gid].specs]
            seconds = train_time(self.model, [dev.spec for dev in job.devices], self.eff, lengths)
            job.busy = True
            self._train_states(job, Activity.TRAIN)
            self._push(self.now + seconds, SimEvent.TRAIN_CHUNK, job.token)
        elif job.final:
            job.busy = True
            self._train_states(job, Activity.TRAIN)
            self._push(self.now + self.config.optimizer_s, SimEvent.TRAIN_STEP, job.token)
        else:
            self._train_states(job, Activity.TRAIN_BUBBLE)

    def _ev_train_ready(self, token: int, _: Any) -> None:
        job = self.job
        if job is not None and job.token == token:
            job.ready = True
            self._train_states(job, Activity.TRAIN_BUBBLE)
            self._train_progress()

    def _ev_train_chunk(self, token: int, _: Any) -> None:
        job = self.job
        if job is not None and job.token == token:
            job.busy = False
            self._train_progress()

    def _ev_train_step(self, token: int, _: Any) -> None:
        job = self.job
        if job is None or job.token != token:
            return
        self.job = None
        stats = self.step_stats.pop(job.aid)
        self.completed_steps[job.step] = stats
        self.step_end[job.step] = self.now
        if job.step == self.config.warmup_steps - 1:
            self.window_start = self.now
        self._observe(TrainStepCompleted(self.now, job.aid, job.step, job.step + 1))
