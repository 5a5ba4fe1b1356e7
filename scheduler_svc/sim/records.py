"""The simulator's mutable records: a sample's trajectory, its group, an engine, the running train step.

Plain slotted classes, not dataclasses: the event loop touches their fields millions of times, and
they are private to the simulation (nothing outside `scheduler_svc.sim` holds one).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from scheduler_svc.roofline import DeviceSpec
from scheduler_svc.sim.model import DevicePerf
from scheduler_svc.sim.results import Activity
from scheduler_svc.sim.workload import SampleSpec


class DeviceMode(Enum):
    """What an engine is doing, as far as routing and decode integration care."""

    IDLE = 0
    ROLLOUT = 1
    PAUSED = 2
    LOADING = 3
    TRAIN = 4
    OFFLINE = 5


#: modes in which the proxy routes requests to an engine (paused/loading ones resume within seconds)
ROUTABLE = (DeviceMode.ROLLOUT, DeviceMode.PAUSED, DeviceMode.LOADING)


class DeviceRole(StrEnum):
    """What the device's memory currently holds: a switch between roles costs `switch_s`."""

    NONE = ""
    ROLLOUT = "rollout"
    TRAIN = "train"


class Group:
    __slots__ = ("gid", "position", "seqs", "specs", "token_versions", "version")

    def __init__(self, gid: str, position: int, specs: list[SampleSpec], version: int) -> None:
        self.gid = gid
        self.position = position
        self.specs = specs
        self.version = version
        self.seqs: list[Seq] = []
        self.token_versions: Counter[int] = Counter()  # over the completed samples


class Seq:
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

    def __init__(self, uid: int, group: Group, index: int, spec: SampleSpec) -> None:
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


#: a queue entry: (order, uid, sequence), the oldest group's samples first
QueueEntry = tuple[tuple[int, int], int, Seq]


class Device:
    """One engine (a device or a tensor-parallel group): its mode, queues and decode state."""

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
        self.mode = DeviceMode.IDLE
        self.role = DeviceRole.NONE
        self.state = Activity.IDLE
        self.running: dict[int, Seq] = {}
        self.heap: list[tuple[float, int, Seq]] = []
        self.local: list[QueueEntry] = []  # heap: this engine's waiting queue
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


class TrainJob:
    __slots__ = ("aid", "busy", "chunks", "devices", "final", "ready", "stalled", "step", "token")

    def __init__(self, aid: str, step: int, devices: list[Device], token: int) -> None:
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
class StepStats:
    step: int
    lags: list[int] = field(default_factory=list)
    token_lags: Counter[int] = field(default_factory=Counter)
    tokens: int = 0
    samples: int = 0
