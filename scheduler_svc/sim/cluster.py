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
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from scheduler_svc.decisions import (
    Assignment,
    LoadWeights,
    Observation,
    PauseRollout,
    Preemption,
    ResourceDown,
    ResourceRegistered,
    ResumeRollout,
    SampleCompleted,
    TagTransition,
    TaskAborted,
    TaskDispatched,
    TrainData,
    TrainStepCompleted,
    WeightsLoaded,
)
from scheduler_svc.errors import ConfigError, SimulationError
from scheduler_svc.loader import Task
from scheduler_svc.roofline import DeviceSpec, device_preset
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.settings import SchedulerSettings
from scheduler_svc.sim.model import DevicePerf, Efficiency, ModelSpec, model_preset, train_time
from scheduler_svc.sim.pipelines import PIPELINES, pipeline_policy
from scheduler_svc.sim.results import (
    ALL_STATES,
    BUBBLE_STATES,
    BUSY_STATES,
    OVERHEAD_STATES,
    Segment,
    SimResult,
    shares,
)
from scheduler_svc.sim.workload import SampleSpec, Workload, workload_preset
from scheduler_svc.tags import ACTIVITY, IDLE, TRAIN

# device modes
M_IDLE, M_ROLLOUT, M_PAUSED, M_LOADING, M_TRAIN, M_OFFLINE = range(6)

ROUTABLE = (M_ROLLOUT, M_PAUSED, M_LOADING)
#: an engine must hold at least one maximum-length (64K) trajectory in its KV cache
MIN_KV_TOKENS = 65_536

# event kinds
E_DEVICE, E_TOOL, E_LOADED, E_TRAIN_READY, E_TRAIN_CHUNK, E_TRAIN_STEP, E_FAIL, E_DETECT, E_JOIN = range(9)


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. Unset sizes are derived from `devices` (see `resolved`)."""

    pipeline: str = "spatiotemporal"
    workload: str = "math"  # "math" | "agentic"
    devices: int = 32
    device_kind: str = "H800"
    #: heterogeneous pool: ((kind, count), ...) replaces devices/device_kind
    device_mix: tuple[tuple[str, int], ...] = ()
    model: str = "qwen3-8b"
    engine_tp: int = 1  # devices per rollout engine (one resource = one engine)
    max_generation: int | None = None  # math: max response tokens; agentic: max context
    train_batch_groups: int | None = None  # B prompts per step; default 2/engine (math), 1/engine (agentic)
    samples_per_task: int | None = None  # n; default 16 (math), 8 (agentic)
    max_running_seqs: int = 64
    inflight_per_resource: int | None = None  # loader capacity; default max_running_seqs (x2 agentic)
    train_fraction: float = 0.25  # share of engines carrying the train tag (disaggregated, spatiotemporal)
    train_resources: int | None = None  # overrides train_fraction
    microbatches: int = 4
    steps: int = 6
    warmup_steps: int = 1
    weight_sync_s: float = 3.0
    switch_s: float = 4.0
    optimizer_s: float = 2.0
    reprefill_on_weight_sync: bool = True
    #: the staleness bound of the asynchronous pipelines (offpolicy_fill, spatiotemporal); None: 1
    max_staleness: int | None = None
    #: False: AReaL's head-only bound (dispatch budget only; stragglers may train with older tokens)
    strict_staleness: bool = True
    #: what a strict bound does with a group that would get too old: "wait" for it, or "abort" it
    straggler: str = "wait"
    max_regenerations: int = 1
    efficiency: Efficiency = field(default_factory=Efficiency)
    memory_fraction: float = 0.9
    activation_reserve_gb: float = 4.0
    failures: tuple[tuple[float, int], ...] = ()  # (time, engine index)
    joins: tuple[tuple[float, str], ...] = ()  # (time, device kind)
    failure_detect_s: float = 10.0
    seed: int = 0
    keep_segments: bool = True
    max_sim_time_s: float = 1e7

    def __post_init__(self) -> None:
        if self.pipeline not in PIPELINES:
            raise ConfigError(f"SimConfig.pipeline must be one of {PIPELINES}, got {self.pipeline!r}")
        if self.workload not in ("math", "agentic"):
            raise ConfigError(f"SimConfig.workload must be 'math' or 'agentic', got {self.workload!r}")
        if self.devices < 2 and not self.device_mix:
            raise ConfigError(f"SimConfig.devices must be >= 2, got {self.devices!r}")
        if self.engine_tp < 1:
            raise ConfigError(f"SimConfig.engine_tp must be >= 1, got {self.engine_tp!r}")
        if self.steps <= self.warmup_steps or self.warmup_steps < 0:
            raise ConfigError(f"SimConfig.steps ({self.steps!r}) must exceed warmup_steps ({self.warmup_steps!r}) >= 0")
        if not 0 < self.train_fraction < 1:
            raise ConfigError(f"SimConfig.train_fraction must be in (0, 1), got {self.train_fraction!r}")
        if self.max_running_seqs < 1 or self.microbatches < 1:
            raise ConfigError(
                f"SimConfig.max_running_seqs and microbatches must be >= 1, got "
                f"{self.max_running_seqs!r}, {self.microbatches!r}"
            )
        if self.straggler not in ("wait", "abort"):
            raise ConfigError(f"SimConfig.straggler must be 'wait' or 'abort', got {self.straggler!r}")
        if self.straggler == "abort" and not self.strict_staleness:
            raise ConfigError("SimConfig.straggler='abort' needs strict_staleness=True")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError(f"SimConfig.max_staleness must be >= 0 or None, got {self.max_staleness!r}")
        for name in ("weight_sync_s", "switch_s", "optimizer_s", "failure_detect_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"SimConfig.{name} must be >= 0, got {getattr(self, name)!r}")

    def engine_specs(self) -> list[DeviceSpec]:
        kinds: list[str] = []
        if self.device_mix:
            for kind, count in self.device_mix:
                kinds.extend([kind] * count)
        else:
            kinds = [self.device_kind] * self.devices
        if len(kinds) % self.engine_tp:
            raise ConfigError(f"{len(kinds)} devices do not split into engines of engine_tp={self.engine_tp}")
        return [device_preset(kinds[i]).scaled(self.engine_tp) for i in range(0, len(kinds), self.engine_tp)]

    def resolved(self) -> dict[str, int]:
        engines = len(self.engine_specs())
        agentic = self.workload == "agentic"
        batch = self.train_batch_groups or (engines if agentic else 2 * engines)
        n = self.samples_per_task or (8 if agentic else 16)
        inflight = self.inflight_per_resource or (self.max_running_seqs * (2 if agentic else 1))
        k = self.train_resources or max(1, round(self.train_fraction * engines))
        if k >= engines:
            raise ConfigError(f"train_resources ({k}) must be smaller than the engine count ({engines})")
        return {"engines": engines, "batch": batch, "n": n, "inflight": inflight, "train_resources": k}


class _Group:
    __slots__ = ("gid", "position", "seqs", "specs", "token_versions", "version")

    def __init__(self, gid: str, position: int, specs: list[SampleSpec], version: int) -> None:
        self.gid = gid
        self.position = position
        self.specs = specs
        self.version = version
        self.seqs: list[_Seq] = []
        self.token_versions: Counter[int] = Counter()  # over the completed samples


class _Seq:
    """One sample (trajectory) moving between engines, tools and queues."""

    __slots__ = (
        "cache_epoch",
        "ctx",
        "dead",
        "generated",
        "group",
        "home",
        "index",
        "k_admit",
        "new_tokens",
        "order",
        "pend",
        "pend_total",
        "remaining",
        "reserved",
        "spec",
        "turn",
        "uid",
        "versions",
    )

    def __init__(self, uid: int, group: _Group, index: int, spec: SampleSpec) -> None:
        self.uid = uid
        self.group = group
        self.index = index
        self.spec = spec
        self.turn = 0
        self.ctx = spec.prompt_tokens  # tokens of the trajectory so far
        self.new_tokens = spec.prompt_tokens  # appended since last on an engine (need prefill anyway)
        self.remaining = spec.turns[0].gen_tokens
        self.generated = 0
        self.home = -1
        self.cache_epoch = -1
        self.k_admit = 0.0
        self.reserved = 0
        self.order = (group.position, index)
        self.versions: dict[int, int] = {}  # generated tokens per policy version
        self.pend: dict[int, int] = {}  # tokens of the current residency already attributed (weight syncs)
        self.pend_total = 0
        self.dead = False  # its group was aborted


class _Device:
    __slots__ = (
        "C",
        "K",
        "cache_epoch",
        "epoch",
        "heap",
        "idx",
        "kv_capacity",
        "last_t",
        "local",
        "mode",
        "perf",
        "qstamp",
        "reserved",
        "rid",
        "role",
        "running",
        "segments",
        "spec",
        "stall_left",
        "stall_overhead",
        "stall_until",
        "stamp",
        "state",
        "totals",
        "version",
    )

    def __init__(self, idx: int, spec: DeviceSpec, perf: DevicePerf, kv_capacity: float) -> None:
        self.idx = idx
        self.rid = f"e{idx:04d}"
        self.spec = spec
        self.perf = perf
        self.kv_capacity = kv_capacity
        self.mode = M_IDLE
        self.role = ""  # "rollout" | "train": what the device's memory currently holds
        self.state = "idle"
        self.running: dict[int, _Seq] = {}
        self.heap: list[tuple[float, int, _Seq]] = []
        self.local: list[tuple[tuple[int, int], int, _Seq]] = []  # heap: this engine's waiting queue
        self.K = 0.0  # decode iterations done
        self.C = 0.0  # context tokens held by running sequences
        self.reserved = 0
        self.last_t = 0.0
        self.stall_until = 0.0
        self.stall_overhead = 0.0
        self.stall_left = 0.0
        self.epoch = 0
        self.stamp = 0
        self.qstamp = 0
        self.cache_epoch = 0
        self.segments: list[list[Any]] = []
        self.totals: dict[str, float] = {}
        self.version = 0  # policy version of the weights the engine generates with


class _TrainJob:
    __slots__ = ("aid", "busy", "chunks", "devices", "final", "ready", "stalled", "step", "token")

    def __init__(self, aid: str, step: int, devices: list[_Device], token: int) -> None:
        self.aid = aid
        self.step = step
        self.devices = devices
        self.token = token
        self.chunks: deque[tuple[str, ...]] = deque()
        self.final = False
        self.ready = False
        self.busy = False
        self.stalled = False


@dataclass
class _StepStats:
    step: int
    lags: list[int] = field(default_factory=list)
    token_lags: Counter[int] = field(default_factory=Counter)
    tokens: int = 0
    samples: int = 0


class ClusterSim:
    def __init__(self, config: SimConfig, *, workload: Workload | None = None) -> None:
        self.config = config
        sizes = config.resolved()
        self.sizes = sizes
        self.model: ModelSpec = model_preset(config.model)
        self.eff = config.efficiency
        self.workload = workload or workload_preset(
            config.workload, seed=config.seed, max_response=config.max_generation
        )
        self.policy = pipeline_policy(
            config.pipeline,
            sizes["train_resources"],
            config.microbatches,
            max_staleness=config.max_staleness,
            strict_staleness=config.strict_staleness,
            straggler=config.straggler,
            max_regenerations=config.max_regenerations,
        )
        steps_needed = (config.steps + config.warmup_steps + 4) * sizes["batch"] * 4
        tasks = [Task(f"task{i:07d}", {}) for i in range(steps_needed)]
        self.scheduler = Scheduler(
            self.policy,
            SchedulerSettings(
                train_batch_groups=sizes["batch"],
                samples_per_task=sizes["n"],
                max_inflight_samples_per_resource=sizes["inflight"],
                heartbeat_timeout_s=1e9,
            ),
            tasks,
            record_log=False,
        )
        self.devices: list[_Device] = []
        self.by_rid: dict[str, _Device] = {}
        for spec in config.engine_specs():
            self._add_device(spec)
        self.now = 0.0
        self.events: list[tuple[float, int, int, Any, Any]] = []
        self._seq = itertools.count()
        self._uid = itertools.count()
        self.global_queue: list[tuple[tuple[int, int], int, _Seq]] = []
        self.routes: list[tuple[int, int, int]] = []  # (load, engine, stamp): the proxy's view
        self.backlog: list[tuple[int, int, int]] = []  # (-queue length, engine, qstamp)
        self.dirty: set[int] = set()
        self.groups: dict[str, _Group] = {}
        self.job: _TrainJob | None = None
        self.step_end: dict[int, float] = {}
        self.step_stats: dict[str, _StepStats] = {}
        self.completed_steps: dict[int, _StepStats] = {}
        self.event_count = 0
        self.window_start: float | None = 0.0 if config.warmup_steps == 0 else None
        self.decode_seconds = 0.0  # engine-seconds spent decoding, inside the measured window
        self.batch_seconds = 0.0  # the same, weighted by the number of running sequences
        self.wasted_tokens = 0  # generated, then discarded by an abort, inside the measured window
        self.aborted_groups = 0
        self.dropped_groups = 0
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

    # ------------------------------------------------------------------------------------ setup

    def _add_device(self, spec: DeviceSpec) -> _Device:
        perf = DevicePerf(self.model, spec, self.eff)
        usable = spec.memory_gb * 1e9 * self.config.memory_fraction - self.model.weight_bytes
        usable -= self.config.activation_reserve_gb * 1e9 * self.config.engine_tp
        kv_capacity = usable / self.model.kv_bytes_per_token
        if kv_capacity < MIN_KV_TOKENS:
            raise ConfigError(
                f"{self.model.name} leaves KV cache room for only {max(kv_capacity, 0):.0f} tokens on "
                f"{spec.kind} ({usable / 1e9:.1f} GB), fewer than {MIN_KV_TOKENS}; raise engine_tp"
            )
        dev = _Device(len(self.devices), spec, perf, kv_capacity)
        self.devices.append(dev)
        self.by_rid[dev.rid] = dev
        return dev

    def _push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, a, b))

    # ------------------------------------------------------------------------------------ main loop

    def run(self) -> SimResult:
        started = time.perf_counter()
        cfg = self.config
        for dev in self.devices:
            self._observe(ResourceRegistered(0.0, dev.rid, dev.spec, 0))
        for t, index in cfg.failures:
            if not 0 <= index < len(self.devices):
                raise ConfigError(f"SimConfig.failures names engine {index}, but there are {len(self.devices)}")
            self._push(t, E_FAIL, index)
        for t, device_kind in cfg.joins:
            self._push(t, E_JOIN, device_kind)
        self._flush()
        handlers: dict[int, Callable[[Any, Any], None]] = {
            E_DEVICE: self._ev_device,
            E_TOOL: self._ev_tool,
            E_LOADED: self._ev_loaded,
            E_TRAIN_READY: self._ev_train_ready,
            E_TRAIN_CHUNK: self._ev_train_chunk,
            E_TRAIN_STEP: self._ev_train_step,
            E_FAIL: self._ev_fail,
            E_DETECT: self._ev_detect,
            E_JOIN: self._ev_join,
        }
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
        return self._result(time.perf_counter() - started)

    def _observe(self, obs: Observation) -> None:
        for d in self.scheduler.handle(obs):
            handler = self._handlers.get(type(d))
            if handler is not None:
                handler(d)  # type: ignore[operator]

    def _flush(self) -> None:
        if self.global_queue:
            self._route_held()
        while self.dirty:
            idx = self.dirty.pop()
            self._reschedule(self.devices[idx])

    # ------------------------------------------------------------------------------------ accounting

    def _segment(self, dev: _Device, t0: float, t1: float, state: str) -> None:
        if t1 <= t0:
            return
        segs = dev.segments
        if segs and segs[-1][2] == state and abs(segs[-1][1] - t0) < 1e-9:
            segs[-1][1] = t1
        else:
            segs.append([t0, t1, state])

    def _close_segment(self, dev: _Device, t: float) -> None:
        if dev.mode != M_ROLLOUT:
            self._segment(dev, dev.last_t, t, dev.state)
            dev.last_t = max(dev.last_t, t)

    def _advance(self, dev: _Device) -> None:
        """Bring a device to `now`: integrate decode progress and record what it did."""
        now = self.now
        t = dev.last_t
        if now <= t:
            return
        if dev.mode != M_ROLLOUT:
            self._segment(dev, t, now, dev.state)
            dev.last_t = now
            return
        if dev.stall_until > t:
            s_end = min(now, dev.stall_until)
            overhead = min(s_end - t, dev.stall_overhead)
            dev.stall_overhead -= overhead
            self._segment(dev, t, t + overhead, "reprefill")
            self._segment(dev, t + overhead, s_end, "rollout")
            t = s_end
        if now > t:
            b = len(dev.running)
            if b:
                dk = dev.perf.steps_in(now - t, b, dev.C)
                dev.K += dk
                dev.C += b * dk
                self._segment(dev, t, now, "rollout")
                if self.window_start is not None and now > self.window_start:
                    seconds = now - max(t, self.window_start)
                    self.decode_seconds += seconds
                    self.batch_seconds += b * seconds
            else:
                self._segment(dev, t, now, "rollout_bubble")
        dev.last_t = now

    def _set_mode(self, dev: _Device, mode: int, state: str) -> None:
        self._advance(dev)
        if dev.mode == M_ROLLOUT and mode != M_ROLLOUT:
            dev.stall_left = max(0.0, dev.stall_until - self.now)
            dev.stall_until = self.now
        dev.mode = mode
        dev.state = state
        dev.stamp += 1
        self.dirty.add(dev.idx)
        self._offer(dev)

    # ------------------------------------------------------------------------------------ engines

    def _reschedule(self, dev: _Device) -> None:
        dev.epoch += 1
        if dev.mode != M_ROLLOUT or not dev.heap:
            return
        self._advance(dev)
        steps = max(0.0, dev.heap[0][0] - dev.K)
        start = max(self.now, dev.stall_until)
        dt = dev.perf.time_for_steps(steps, len(dev.running), dev.C)
        self._push(start + dt, E_DEVICE, dev.idx, dev.epoch)

    def _fits(self, dev: _Device, seq: _Seq) -> bool:
        if len(dev.running) >= self.config.max_running_seqs:
            return False
        need = seq.ctx + seq.remaining
        return not dev.running or dev.reserved + need <= dev.kv_capacity

    def _offer(self, dev: _Device) -> None:
        """Advertise an engine's load to the router (engines loading weights for rollout count too)."""
        if dev.mode in ROUTABLE:
            dev.stamp += 1
            heapq.heappush(self.routes, (len(dev.running) + len(dev.local), dev.idx, dev.stamp))

    def _route(self, seq: _Seq) -> None:
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

    def _queue_at(self, dev: _Device, seq: _Seq) -> None:
        heapq.heappush(dev.local, (seq.order, seq.uid, seq))
        self._fill(dev)

    def _note_backlog(self, dev: _Device) -> None:
        """Advertise a serving engine's waiting queue to idle engines (work stealing)."""
        dev.qstamp += 1
        if dev.local and dev.mode == M_ROLLOUT:
            heapq.heappush(self.backlog, (-len(dev.local), dev.idx, dev.qstamp))

    def _steal(self, thief: _Device) -> _Seq | None:
        """Work stealing: a request still waiting in the longest queue of a full serving engine (not
        started there, so it holds no KV) moves to an engine with room; the thief pays any lost
        prefix cache. Paused or loading engines are not robbed: they resume within seconds."""
        backlog = self.backlog
        while backlog:
            _, idx, qstamp = backlog[0]
            victim = self.devices[idx]
            if qstamp != victim.qstamp or victim.mode != M_ROLLOUT or not victim.local or victim is thief:
                heapq.heappop(backlog)
                continue
            if not self._fits(thief, victim.local[0][2]):
                return None
            seq = heapq.heappop(victim.local)[2]
            self._note_backlog(victim)
            self._offer(victim)
            return seq
        return None

    def _admit(self, dev: _Device, seq: _Seq) -> None:
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

    def _fill(self, dev: _Device) -> None:
        """A serving engine admits queued requests (oldest first) while it has room."""
        if dev.mode == M_ROLLOUT:
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

    def _leave(self, dev: _Device, seq: _Seq, generated: float) -> None:
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
    def _attribute(dev: _Device, seq: _Seq, gen: int) -> None:
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

    def _book_before_swap(self, dev: _Device) -> None:
        """The engine is about to swap weights under its running requests (partial rollout): the
        tokens they generated so far carry the version being replaced."""
        self._advance(dev)
        for seq in dev.running.values():
            done = min(round(dev.K - seq.k_admit), seq.remaining)
            n = done - seq.pend_total
            if n > 0:
                seq.pend[dev.version] = seq.pend.get(dev.version, 0) + n
                seq.pend_total += n

    def _ev_device(self, idx: int, epoch: int) -> None:
        dev = self.devices[idx]
        if epoch != dev.epoch or dev.mode != M_ROLLOUT:
            return
        self._advance(dev)
        heap = dev.heap
        if heap and heap[0][0] - dev.K < 1e-6 * (1.0 + dev.K):
            dev.C += len(dev.running) * max(0.0, heap[0][0] - dev.K)
            dev.K = max(dev.K, heap[0][0])
        tol = 1e-9 * (1.0 + dev.K)
        finished: list[_Seq] = []
        while heap and heap[0][0] <= dev.K + tol:
            _, _, seq = heapq.heappop(heap)
            self._leave(dev, seq, seq.remaining)
            finished.append(seq)
        self._fill(dev)
        self.dirty.add(idx)
        for seq in finished:
            self._turn_done(seq)

    def _turn_done(self, seq: _Seq) -> None:
        turns = seq.spec.turns
        turn = turns[seq.turn]
        seq.turn += 1
        if seq.turn >= len(turns):
            seq.group.token_versions.update(seq.versions)
            versions = tuple(sorted(seq.versions.items()))
            self._observe(SampleCompleted(self.now, seq.group.gid, seq.index, seq.generated, versions))
            return
        seq.remaining = turns[seq.turn].gen_tokens
        self._push(self.now + turn.tool_s, E_TOOL, seq, turn.obs_tokens)

    def _ev_tool(self, seq: _Seq, obs_tokens: int) -> None:
        if seq.dead:
            return
        seq.ctx += obs_tokens
        seq.new_tokens += obs_tokens
        home = self.devices[seq.home] if seq.home >= 0 else None
        if home is not None and home.mode in (M_ROLLOUT, M_PAUSED):
            self._queue_at(home, seq)  # sticky: the session's prefix cache lives there
        else:
            seq.home = -1
            self._route(seq)

    def _abort(self, dev: _Device) -> None:
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
        self._set_mode(dev, M_IDLE, "idle")
        dev.stall_left = 0.0
        for seq in moved:
            seq.home = -1
            self._route(seq)

    # ------------------------------------------------------------------------------------ decisions

    def _on_dispatched(self, d: TaskDispatched) -> None:
        # a re-generation samples the same prompt again: fresh responses, not the aborted ones
        salt = d.attempt * d.n_samples
        specs = [self.workload.sample(d.position, salt + i) for i in range(d.n_samples)]
        group = _Group(d.group_id, d.position, specs, d.policy_version)
        self.groups[d.group_id] = group
        for i, spec in enumerate(specs):
            seq = _Seq(next(self._uid), group, i, spec)
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

    def _device(self, rid: str) -> _Device | None:
        dev = self.by_rid[rid]
        return None if dev.mode == M_OFFLINE else dev

    def _on_pause(self, d: PauseRollout) -> None:
        dev = self._device(d.resource_id)
        if dev is None:
            return
        if d.mode == "abort":
            self._abort(dev)
        elif dev.mode == M_ROLLOUT:
            self._set_mode(dev, M_PAUSED, "weight_sync")
            self._book_before_swap(dev)

    def _on_load(self, d: LoadWeights) -> None:
        dev = self._device(d.resource_id)
        if dev is None:
            return
        seconds = self.config.weight_sync_s + (self.config.switch_s if dev.role == "train" else 0.0)
        if dev.mode != M_PAUSED:
            self._set_mode(dev, M_LOADING, "weight_sync")
        self._book_before_swap(dev)
        dev.version = d.version  # what it generates with once it resumes
        dev.role = "rollout"
        dev.cache_epoch += 1
        self._push(self.now + seconds, E_LOADED, dev.idx, d.version)

    def _ev_loaded(self, idx: int, version: int) -> None:
        dev = self.devices[idx]
        if dev.mode != M_OFFLINE:
            self._observe(WeightsLoaded(self.now, dev.rid, version))

    def _on_resume(self, d: ResumeRollout) -> None:
        dev = self._device(d.resource_id)
        if dev is None:
            return
        self._advance(dev)
        dev.mode = M_ROLLOUT
        dev.state = "rollout"
        dev.role = "rollout"
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
        switching = any(dev.role == "rollout" for dev in devices)
        job = _TrainJob(d.assignment_id, d.step or 0, devices, next(self._seq))
        for dev in devices:
            if dev.mode == M_OFFLINE:
                job.stalled = True
                continue
            self._set_mode(dev, M_TRAIN, "switch" if switching else "train_bubble")
            dev.role = "train"
        self.job = job
        self.step_stats[d.assignment_id] = _StepStats(job.step)
        if switching:
            self._push(self.now + self.config.switch_s, E_TRAIN_READY, job.token)
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
            if dev.mode != M_OFFLINE:
                self._set_mode(dev, M_IDLE, "idle")

    def _on_tag(self, d: TagTransition) -> None:
        if d.tag_kind != ACTIVITY or d.to_tags != (IDLE,):
            return
        dev = self._device(d.resource_id)
        if dev is not None and dev.mode in (M_TRAIN, M_IDLE, M_LOADING):
            self._set_mode(dev, M_IDLE, "idle")

    # ------------------------------------------------------------------------------------ trainer

    def _train_states(self, job: _TrainJob, state: str) -> None:
        for dev in job.devices:
            if dev.mode == M_TRAIN and dev.state != state:
                self._set_mode(dev, M_TRAIN, state)

    def _train_progress(self) -> None:
        job = self.job
        if job is None or not job.ready or job.busy or job.stalled:
            return
        if job.chunks:
            chunk = job.chunks.popleft()
            lengths = [spec.total_tokens for gid in chunk for spec in self.groups[gid].specs]
            seconds = train_time(self.model, [dev.spec for dev in job.devices], self.eff, lengths)
            job.busy = True
            self._train_states(job, "train")
            self._push(self.now + seconds, E_TRAIN_CHUNK, job.token)
        elif job.final:
            job.busy = True
            self._train_states(job, "train")
            self._push(self.now + self.config.optimizer_s, E_TRAIN_STEP, job.token)
        else:
            self._train_states(job, "train_bubble")

    def _ev_train_ready(self, token: int, _: Any) -> None:
        job = self.job
        if job is not None and job.token == token:
            job.ready = True
            self._train_states(job, "train_bubble")
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

    # ------------------------------------------------------------------------------------ faults

    def _ev_fail(self, idx: int, _: Any) -> None:
        dev = self.devices[idx]
        if dev.mode == M_OFFLINE:
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
        self._set_mode(dev, M_OFFLINE, "offline")
        for seq in moved:
            seq.home = -1
            self._route(seq)
        self._push(self.now + self.config.failure_detect_s, E_DETECT, dev.rid)

    def _ev_detect(self, rid: str, _: Any) -> None:
        self._observe(ResourceDown(self.now, rid, "engine_crashed"))

    def _ev_join(self, kind: str, _: Any) -> None:
        dev = self._add_device(device_preset(kind).scaled(self.config.engine_tp))
        dev.last_t = self.now
        self._observe(ResourceRegistered(self.now, dev.rid, dev.spec, None))

    # ------------------------------------------------------------------------------------ results

    def _result(self, wall_clock_s: float) -> SimResult:
        cfg = self.config
        first = cfg.warmup_steps - 1
        t0 = self.step_end[first] if first >= 0 else 0.0
        last = cfg.steps - 1
        t1 = self.step_end[last]
        measured = [self.completed_steps[s] for s in range(cfg.warmup_steps, cfg.steps)]
        window = max(t1 - t0, 1e-9)
        tokens = sum(s.tokens for s in measured)
        samples = sum(s.samples for s in measured)
        lags = [lag for s in measured for lag in s.lags]
        token_lags: Counter[int] = Counter()
        for s in measured:
            token_lags.update(s.token_lags)
        trained_tokens = sum(token_lags.values())
        totals = dict.fromkeys(ALL_STATES, 0.0)
        for dev in self.devices:
            for s0, s1, state in dev.segments:
                lo, hi = max(s0, t0), min(s1, t1)
                if hi > lo:
                    totals[state] = totals.get(state, 0.0) + hi - lo
        share = shares(totals)
        segments: list[list[Segment]] = []
        if cfg.keep_segments:
            segments = [[(s[0], s[1], s[2]) for s in dev.segments] for dev in self.devices]
        return SimResult(
            pipeline=cfg.pipeline,
            workload=cfg.workload,
            devices=len(self.devices) * cfg.engine_tp,
            train_resources=self.sizes["train_resources"] if cfg.pipeline != "colocated_sync" else len(self.devices),
            steps_measured=len(measured),
            window_s=window,
            tokens_per_s=tokens / window,
            samples_per_s=samples / window,
            utilisation=sum(share[s] for s in BUSY_STATES),
            bubble=sum(share[s] for s in BUBBLE_STATES),
            overhead=sum(share[s] for s in OVERHEAD_STATES),
            mean_staleness=sum(lags) / len(lags) if lags else 0.0,
            max_staleness=max(lags) if lags else 0,
            mean_token_staleness=(
                sum(lag * n for lag, n in token_lags.items()) / trained_tokens if trained_tokens else 0.0
            ),
            max_token_staleness=max((lag for lag, n in token_lags.items() if n), default=0),
            waste=self.wasted_tokens / (tokens + self.wasted_tokens) if tokens + self.wasted_tokens else 0.0,
            aborted_groups=self.aborted_groups,
            dropped_groups=self.dropped_groups,
            mean_step_s=window / max(len(measured), 1),
            mean_decode_batch=self.batch_seconds / self.decode_seconds if self.decode_seconds else 0.0,
            samples_per_step=samples / max(len(measured), 1),
            state_shares=share,
            events=self.event_count,
            wall_clock_s=wall_clock_s,
            sim_time_s=self.now,
            settings={**self.sizes, **{k: v for k, v in asdict(cfg).items() if k != "efficiency"}},
            segments=segments,
            device_names=[dev.rid for dev in self.devices],
        )


def run_simulation(config: SimConfig, *, workload: Workload | None = None) -> SimResult:
    """Simulate `config.steps` train steps of one pipeline and report its steady-state numbers."""
    return ClusterSim(config, workload=workload).run()
