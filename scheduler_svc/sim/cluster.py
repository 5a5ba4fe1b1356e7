"""Discrete-event simulation of an RL cluster, driven by the real scheduler core.

The simulator plays the world around `scheduler_svc.Scheduler`: rollout engines (continuous
batching, analytic decode integration between events), agents (multi-turn sessions with tool
latency), the capture proxy's routing (least-loaded engine, sticky sessions for prefix-cache reuse),
and an SPMD trainer. It feeds the core the same observations the Kafka shell would
(ResourceRegistered, SampleCompleted, TrainStepCompleted, WeightsLoaded, ResourceDown) and carries
out its decisions (PauseRollout, LoadWeights, ResumeRollout, Assignment, TrainData, TaskDispatched).
No pipeline has code of its own here: the five pipelines differ only in their TagPolicy.

Every pipeline pays the same costs: the same batch (B prompts x n samples), the same engine limits
(running sequences, KV capacity), `weight_sync_s` per weight load, `switch_s` per role switch of a
device between rollout and training, and re-prefill of every context whose KV cache was lost
(migration after preemption, new weights under partial rollout). Preempted requests keep their
tokens (partial rollout); a crashed engine loses the turn it was generating.

Versions are per token, as the trajectory manager records them: every engine generates with the
version it last loaded, a request paused for a weight sync keeps the tokens it has (old version)
and continues with the new weights, so a sample that spans a sync reports tokens of several
versions (`SampleCompleted.token_versions`). Staleness is measured on the trained tokens (mean and
max lag). A group aborted because it could no longer be trained within the bound (policy
`straggler="abort"`) has every token it generated counted as waste, and its re-generation draws
fresh samples for the same prompt.

Model limits, stated so nobody over-reads the numbers: prefill stalls the whole engine (no chunked
prefill overlap); admission reserves each request's turn length up front (an oracle, where real
engines admit optimistically and retract); network transfers other than weight sync are free.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

from scheduler_svc.decisions import (
    Assignment,
    LoadWeights,
    PauseRollout,
    Preemption,
    ResourceRegistered,
    ResumeRollout,
    TagTransition,
    TaskAborted,
    TaskDispatched,
    TrainData,
)
from scheduler_svc.errors import ConfigError, SimulationError
from scheduler_svc.sim.config import SimConfig
from scheduler_svc.sim.handlers import DecisionHandlers
from scheduler_svc.sim.metrics import sim_result
from scheduler_svc.sim.results import SimResult
from scheduler_svc.sim.workload import Workload
from scheduler_svc.sim.world import SimEvent


class ClusterSim(DecisionHandlers):
    """The event loop over the layered world (see `scheduler_svc.sim.world`)."""

    def __init__(self, config: SimConfig, *, workload: Workload | None = None) -> None:
        super().__init__(config, workload=workload)
        self._handlers = {
            TaskDispatched: self._on_dispatched,
            PauseRollout: self._on_pause,
            LoadWeights: self._on_load,
            ResumeRollout: self._on_resume,
            Assignment: self._on_assignment,
            TrainData: self._on_train_data,
            Preemption: self._on_preemption,
            TagTransition: self._on_tag,
            TaskAborted: self._on_aborted,
        }
        self._events: dict[SimEvent, Callable[[Any, Any], None]] = {
            SimEvent.DEVICE: self._ev_device,
            SimEvent.TOOL: self._ev_tool,
            SimEvent.LOADED: self._ev_loaded,
            SimEvent.TRAIN_READY: self._ev_train_ready,
            SimEvent.TRAIN_CHUNK: self._ev_train_chunk,
            SimEvent.TRAIN_STEP: self._ev_train_step,
            SimEvent.FAIL: self._ev_fail,
            SimEvent.DETECT: self._ev_detect,
            SimEvent.JOIN: self._ev_join,
        }

    def _start(self) -> None:
        """Register every engine with the core and schedule the configured faults and joins."""
        cfg = self.config
        for dev in self.devices:
            self._observe(ResourceRegistered(0.0, dev.rid, dev.spec, 0))
        for t, index in cfg.failures:
            if not 0 <= index < len(self.devices):
                raise ConfigError(f"SimConfig.failures names engine {index}, but there are {len(self.devices)}")
            self._push(t, SimEvent.FAIL, index)
        for t, device_kind in cfg.joins:
            self._push(t, SimEvent.JOIN, device_kind)
        self._flush()

    def run(self) -> SimResult:
        started = time.perf_counter()
        cfg = self.config
        self._start()
        handlers = self._events
        events = self.events
        while events and len(self.step_end) < cfg.steps:
            t, _, kind, a, b = heapq.heappop(events)
            if t > cfg.max_sim_time_s:
                break
            self.now = t
            self.event_count += 1
            handlers[kind](a, b)
            # Simultaneous events (a fleet resuming together) are all applied before requests are
            # routed, so the router sees every engine that is up at this instant.
            if not events or events[0][0] > t:
                self._flush()
        if len(self.step_end) < cfg.steps:
            raise SimulationError(
                f"{cfg.pipeline}: only {len(self.step_end)} of {cfg.steps} steps finished by t={self.now:.0f}s "
                "(the pipeline stalled or max_sim_time_s is too small)"
            )
        for dev in self.devices:
            self._advance(dev)
            self._close_segment(dev, self.now)
        return sim_result(self, time.perf_counter() - started)

    def _flush(self) -> None:
        if self.global_queue:
            self._route_held()
        while self.dirty:
            idx = self.dirty.pop()
            self._reschedule(self.devices[idx])


def run_simulation(config: SimConfig, *, workload: Workload | None = None) -> SimResult:
    """Simulate `config.steps` train steps of one pipeline and report its steady-state numbers."""
    return ClusterSim(config, workload=workload).run()
