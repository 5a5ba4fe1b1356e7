"""The simulated world's state: the scheduler core, the engines, the proxy's queues, the clock.

`SimWorld` is the bottom layer of the simulator. Each layer above adds one concern and uses only
the layers below it: engine physics (`engines`), routing (`routing`), the agents' sessions
(`sessions`), the trainer (`trainer`), faults (`faults`), the handlers of the core's decisions
(`handlers`), and the event loop (`cluster.ClusterSim`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from scheduler_svc.decisions import Observation
from scheduler_svc.errors import ConfigError
from scheduler_svc.roofline import DeviceSpec
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.settings import SchedulerSettings
from scheduler_svc.sim.config import SimConfig
from scheduler_svc.sim.model import DevicePerf, ModelSpec, model_preset
from scheduler_svc.sim.pipelines import pipeline_policy
from scheduler_svc.sim.records import Device, Group, QueueEntry, StepStats, TrainJob
from scheduler_svc.sim.workload import Workload, workload_preset
from scheduler_svc.tasks import Task

#: an engine must hold at least one maximum-length (64K) trajectory in its KV cache
MIN_KV_TOKENS = 65_536


class SimEvent(IntEnum):
    """What a scheduled event does when its time comes."""

    DEVICE = 0  # an engine's next sequence finishes its turn
    TOOL = 1  # a tool call returns
    LOADED = 2  # an engine finished loading weights
    TRAIN_READY = 3  # the train devices switched roles
    TRAIN_CHUNK = 4  # a micro-batch was trained on
    TRAIN_STEP = 5  # the optimizer step ended
    FAIL = 6  # an engine crashes
    DETECT = 7  # the crash is noticed
    JOIN = 8  # a device joins


#: (time, tie-breaking sequence number, kind, two arguments)
Event = tuple[float, int, SimEvent, Any, Any]


def build_scheduler(config: SimConfig, sizes: dict[str, int]) -> Scheduler:
    """The real scheduler core, under the pipeline's policy, with enough tasks for the whole run."""
    policy = pipeline_policy(
        config.pipeline,
        sizes["train_resources"],
        config.microbatches,
        max_staleness=config.max_staleness,
        strict_staleness=config.strict_staleness,
        straggler=config.straggler,
        max_regenerations=config.max_regenerations,
    )
    model = model_preset(config.model)
    steps_needed = (config.steps + config.warmup_steps + 4) * sizes["batch"] * 4
    tasks = [Task(f"task{i:07d}", {}) for i in range(steps_needed)]
    settings = SchedulerSettings(
        train_batch_groups=sizes["batch"],
        samples_per_task=sizes["n"],
        max_inflight_samples_per_resource=sizes["inflight"],
        heartbeat_timeout_s=1e9,
        kv_balance_tokens=model.weight_bytes / model.kv_bytes_per_token,
    )
    return Scheduler(policy, settings, tasks, record_log=False)


class SimWorld:
    def __init__(self, config: SimConfig, *, workload: Workload | None = None) -> None:
        self.config = config
        self.sizes = config.resolved()
        self.model: ModelSpec = model_preset(config.model)
        self.eff = config.efficiency
        self.workload = workload or workload_preset(
            config.workload, seed=config.seed, max_response=config.max_generation
        )
        self.scheduler = build_scheduler(config, self.sizes)
        self.policy = self.scheduler.policy
        self.devices: list[Device] = []
        self.by_rid: dict[str, Device] = {}
        for spec in config.engine_specs():
            self._add_device(spec)
        self.now = 0.0
        self.events: list[Event] = []
        self._seq = itertools.count()
        self._uid = itertools.count()
        self.global_queue: list[QueueEntry] = []
        self.routes: list[tuple[int, int, int]] = []  # (load, engine, stamp): the proxy's view
        self.backlog: list[tuple[int, int, int]] = []  # (-queue length, engine, qstamp)
        self.dirty: set[int] = set()
        self.groups: dict[str, Group] = {}
        self.job: TrainJob | None = None
        self.step_end: dict[int, float] = {}
        self.step_stats: dict[str, StepStats] = {}
        self.completed_steps: dict[int, StepStats] = {}
        self._init_counters()
        #: the handler of each decision type the core emits (filled by the decision layer)
        self._handlers: dict[type, Callable[[Any], None]] = {}

    def _init_counters(self) -> None:
        self.event_count = 0
        self.window_start: float | None = 0.0 if self.config.warmup_steps == 0 else None
        self.decode_seconds = 0.0  # engine-seconds spent decoding, inside the measured window
        self.batch_seconds = 0.0  # the same, weighted by the number of running sequences
        self.wasted_tokens = 0  # generated, then discarded by an abort, inside the measured window
        self.aborted_groups = 0
        self.dropped_groups = 0

    def _add_device(self, spec: DeviceSpec) -> Device:
        perf = DevicePerf(self.model, spec, self.eff)
        usable = spec.memory_gb * 1e9 * self.config.memory_fraction - self.model.weight_bytes
        usable -= self.config.activation_reserve_gb * 1e9 * self.config.engine_tp
        kv_capacity = usable / self.model.kv_bytes_per_token
        if kv_capacity < MIN_KV_TOKENS:
            raise ConfigError(
                f"{self.model.name} leaves KV cache room for only {max(kv_capacity, 0):.0f} tokens on "
                f"{spec.kind} ({usable / 1e9:.1f} GB), fewer than {MIN_KV_TOKENS}; raise engine_tp"
            )
        dev = Device(len(self.devices), spec, perf, kv_capacity)
        self.devices.append(dev)
        self.by_rid[dev.rid] = dev
        return dev

    def _push(self, t: float, kind: SimEvent, a: Any = None, b: Any = None) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, a, b))

    def _observe(self, obs: Observation) -> None:
        """Feed the core an observation and carry out the decisions it answers with."""
        for d in self.scheduler.handle(obs):
            handler = self._handlers.get(type(d))
            if handler is not None:
                handler(d)
