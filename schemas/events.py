"""Typed events: one frozen dataclass per `.avsc` record, with `to_avro` / `from_avro`.

Events are facts: immutable, named in the past tense or as commands, each with the envelope
(`event_id`, `ts_ms`, `producer`, `correlation_id`; `event_type` is the class name). Packed token
payloads are held as `PackedArray`s (tuple-like, numpy-backed; see `schemas.packed`): pass a tuple,
list or numpy array and it is converted; a decoded event wraps the message bytes without a copy.
Float32 fields round to float32 when the event is built, so a round trip is exact.
"""

from __future__ import annotations

import dataclasses
import enum
import time
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeVar

from schemas.errors import DecodeError, EncodeError
from schemas.packed import Float32s, Int32s, PackedArray, UInt8s
from schemas.registry import default_registry

E = TypeVar("E", bound="Event")


def new_event_id() -> str:
    return uuid.uuid4().hex


def now_ms() -> int:
    return int(time.time() * 1000)


def packed(kind: type[PackedArray]) -> Any:
    """A token payload field: written as packed little-endian bytes, held as a `PackedArray`."""
    return field(default=kind(), metadata={"packed": kind})


class _PackedFields:
    """Converts tuples, lists or numpy arrays given for packed fields into their `PackedArray`."""

    def __post_init__(self) -> None:
        cls: Any = self.__class__
        for name, kind in _packed_fields(cls):
            value = getattr(self, name)
            if type(value) is not kind:
                object.__setattr__(self, name, kind(value))


class SessionStatus(enum.StrEnum):
    COMPLETED = "completed"  # the agent reported its reward
    FAILED = "failed"  # the agent gave up or crashed; reward as reported (often 0)
    ABORTED = "aborted"  # dropped by an operator or a drain
    TIMEOUT = "timeout"  # never ended: closed by the trajectory processor's TTL


class TagKind(enum.StrEnum):
    CAPABILITY = "capability"  # what a resource may do (rollout, train, reference, critic)
    ACTIVITY = "activity"  # what it does right now (idle, rollout, train, ...)


class PauseMode(enum.StrEnum):
    ABORT = "abort"  # stop now, return partial outputs (preemption): the adapter resumes them elsewhere
    IN_PLACE = "in_place"  # keep running requests, continue them after the pause (weight sync)


@dataclass(frozen=True, kw_only=True)
class Event(_PackedFields):
    """Envelope shared by every event."""

    event_id: str = field(default_factory=new_event_id)
    ts_ms: int = field(default_factory=now_ms)
    producer: str = ""
    correlation_id: str = ""

    @property
    def event_type(self) -> str:
        return type(self).__name__

    @property
    def key(self) -> str:
        """Kafka key: the entity the topic is partitioned by (docs/architecture.md, "Topics")."""
        return self.correlation_id

    def to_avro(self) -> dict[str, Any]:
        record = _to_record(self)
        record["event_type"] = self.event_type
        return record

    @classmethod
    def from_avro(cls: type[E], record: dict[str, Any]) -> E:
        if record.get("event_type", cls.__name__) != cls.__name__:
            raise DecodeError(f"record of type {record.get('event_type')!r} read as {cls.__name__}")
        return _from_record(cls, record)


# --- nested records -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Segment(_PackedFields):
    """One engine run inside an LLM call; a preempted call has several."""

    resource_id: str
    weight_version: int
    start: int
    num_tokens: int
    finish_reason: str
    started_ms: int
    ended_ms: int


@dataclass(frozen=True, kw_only=True)
class TrajectoryNode(_PackedFields):
    """A run of tokens in a session's prefix tree, shared by every call below it."""

    node_id: int
    parent: int
    token_ids: Int32s = packed(Int32s)
    loss_mask: UInt8s = packed(UInt8s)
    logprobs: Float32s = packed(Float32s)
    versions: Int32s = packed(Int32s)


# --- llm.calls / sessions / trajectories ----------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LLMCall(Event):
    call_id: str
    session_id: str
    agent_id: str
    task_id: str = ""
    group_id: str = ""
    model: str
    turn: int
    prompt_ids: Int32s = packed(Int32s)
    output_ids: Int32s = packed(Int32s)
    output_logprobs: Float32s = packed(Float32s)
    output_versions: Int32s = packed(Int32s)
    finish_reason: str
    segments: tuple[Segment, ...] = ()
    request_ms: int
    completed_ms: int
    drift: bool = False
    parent_call_id: str = ""

    @property
    def key(self) -> str:
        return self.session_id


@dataclass(frozen=True, kw_only=True)
class SessionStarted(Event):
    session_id: str
    agent_id: str
    task_id: str = ""
    group_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.session_id


@dataclass(frozen=True, kw_only=True)
class SessionEnded(Event):
    session_id: str
    agent_id: str
    task_id: str = ""
    group_id: str = ""
    reward: float
    status: SessionStatus = SessionStatus.COMPLETED
    num_calls: int = 0

    @property
    def key(self) -> str:
        return self.session_id


@dataclass(frozen=True, kw_only=True)
class Trajectory(Event):
    trajectory_id: str
    session_id: str
    agent_id: str
    task_id: str = ""
    group_id: str = ""
    reward: float
    status: str
    nodes: tuple[TrajectoryNode, ...] = ()
    call_ids: tuple[str, ...] = ()
    min_version: int
    max_version: int
    tokens_in_calls: int
    tokens_in_tree: int
    drift_calls: int = 0

    @property
    def key(self) -> str:
        return self.group_id or self.session_id


@dataclass(frozen=True, kw_only=True)
class BatchReady(Event):
    group_id: str
    task_id: str
    trajectory_ids: tuple[str, ...] = ()
    num_samples: int
    min_version: int
    max_version: int
    ready_groups: int = 0

    @property
    def key(self) -> str:
        return self.group_id


# --- tasks -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TaskDispatched(Event):
    task_id: str
    group_id: str
    n_samples: int
    payload: str
    policy_version: int
    seq: int

    @property
    def key(self) -> str:
        return self.task_id


@dataclass(frozen=True, kw_only=True)
class TaskCompleted(Event):
    task_id: str
    group_id: str
    num_samples: int
    mean_reward: float
    status: str

    @property
    def key(self) -> str:
        return self.task_id


# --- resources / scheduler -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ResourceRegistered(Event):
    resource_id: str
    endpoint: str
    device_kind: str
    num_devices: int = 1
    memory_bytes: int
    hbm_bandwidth: float
    peak_flops: float
    capabilities: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Event):
    resource_id: str
    activity: str
    weight_version: int
    running_requests: int
    queued_requests: int
    tokens_generated: int

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class ResourceLost(Event):
    resource_id: str
    reason: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class TagTransition(Event):
    resource_id: str
    tag_kind: TagKind
    from_tags: tuple[str, ...] = ()
    to_tags: tuple[str, ...] = ()
    cause: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class Preemption(Event):
    resource_id: str
    preempted_task: str
    by_task: str
    assignment_id: str
    reason: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class Assignment(Event):
    assignment_id: str
    task_kind: str
    resource_ids: tuple[str, ...] = ()
    step: int
    policy_version: int
    payload: str = "{}"

    @property
    def key(self) -> str:
        return self.resource_ids[0] if self.resource_ids else self.assignment_id


# --- control / weights -----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PauseRollout(Event):
    resource_id: str
    mode: PauseMode
    reason: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class ResumeRollout(Event):
    resource_id: str
    reason: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class LoadWeights(Event):
    resource_id: str
    version: int
    uri: str
    sha256: str

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class ControlAck(Event):
    resource_id: str
    command_id: str
    command: str
    ok: bool
    error: str = ""
    duration_ms: float = 0.0

    @property
    def key(self) -> str:
        return self.resource_id


@dataclass(frozen=True, kw_only=True)
class WeightsPublished(Event):
    model: str
    version: int
    uri: str
    sha256: str
    step: int
    num_bytes: int = 0

    @property
    def key(self) -> str:
        return self.model


@dataclass(frozen=True, kw_only=True)
class WeightsLoaded(Event):
    model: str
    resource_id: str
    version: int
    pause_ms: float
    load_ms: float

    @property
    def key(self) -> str:
        return self.model


# --- train / metrics / dlq -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrainStepStarted(Event):
    run_id: str
    step: int
    policy_version: int
    resource_ids: tuple[str, ...] = ()
    num_trajectories: int
    num_tokens: int

    @property
    def key(self) -> str:
        return self.run_id


@dataclass(frozen=True, kw_only=True)
class TrainStepCompleted(Event):
    run_id: str
    step: int
    new_version: int
    loss: float
    reward_mean: float
    kl: float
    clip_fraction: float
    staleness_histogram: tuple[int, ...] = ()
    num_tokens: int
    trajectory_ids: tuple[str, ...] = ()
    duration_ms: float
    status: str = "completed"
    reason: str = ""
    dropped_group_ids: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.run_id


@dataclass(frozen=True, kw_only=True)
class MetricSample(Event):
    service: str
    resource_id: str = ""
    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.service


@dataclass(frozen=True, kw_only=True)
class DeadLetter(Event):
    source_topic: str
    source_partition: int
    source_offset: int
    key_bytes: bytes | None = None
    value: bytes | None = None
    reason: str
    consumer_group: str = ""

    @property
    def key(self) -> str:
        return f"{self.source_topic}:{self.source_partition}:{self.source_offset}"


# --- scheduler journal, train data, weight syncs (scheduler_svc service) ----------------------


@dataclass(frozen=True, kw_only=True)
class SchedulerObserved(Event):
    """The scheduler's journal: one handled input, written before the decisions it caused."""

    run_id: str
    seq: int
    source_topic: str = ""
    source_partition: int = -1
    source_offset: int = -1
    input: str
    observations: str
    event_seq: int
    num_events: int

    @property
    def key(self) -> str:
        return self.run_id


@dataclass(frozen=True, kw_only=True)
class SchedulerCheckpoint(Event):
    """Every decision of the journal before it is published; config and (sometimes) the state."""

    run_id: str
    observed_seq: int
    event_seq: int
    config: str
    state_sha256: str = ""
    state: str = ""

    @property
    def key(self) -> str:
        return self.run_id


@dataclass(frozen=True, kw_only=True)
class TrainData(Event):
    run_id: str
    assignment_id: str
    step: int
    group_ids: tuple[str, ...] = ()
    group_versions: tuple[int, ...] = ()
    staleness_histogram: tuple[int, ...] = ()
    final: bool

    @property
    def key(self) -> str:
        return self.run_id


@dataclass(frozen=True, kw_only=True)
class WeightSyncStarted(Event):
    model: str
    sync_id: str
    version: int
    resource_ids: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.model


@dataclass(frozen=True, kw_only=True)
class WeightSyncCompleted(Event):
    model: str
    sync_id: str
    version: int
    resource_ids: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.model


EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        LLMCall, SessionStarted, SessionEnded, Trajectory, BatchReady, TaskDispatched, TaskCompleted,
        ResourceRegistered, Heartbeat, ResourceLost, TagTransition, Preemption, Assignment,
        PauseRollout, ResumeRollout, LoadWeights, ControlAck, WeightsPublished, WeightsLoaded,
        TrainStepStarted, TrainStepCompleted, MetricSample, DeadLetter,
        SchedulerObserved, SchedulerCheckpoint, TrainData, WeightSyncStarted, WeightSyncCompleted,
    )
}

# Python attribute -> Avro field where a name would clash with the envelope (`key` is a property).
_RENAMES: dict[tuple[str, str], str] = {("DeadLetter", "key_bytes"): "key"}

# --- generic conversion ----------------------------------------------------------------------

_Converter = tuple[str, str, Callable[[Any], Any] | None, Callable[[Any], Any] | None]


@cache
def _converters(cls: Any) -> list[_Converter]:
    """(attribute, avro field, to-avro, from-avro) per field, derived once from the type hints;
    None where the value passes through unchanged (most fields: kept off the hot path)."""
    hints = typing.get_type_hints(cls)
    out: list[_Converter] = []
    for f in dataclasses.fields(cls):
        avro_name = _RENAMES.get((cls.__name__, f.name), f.name)
        out.append((f.name, avro_name, *_field_codec(hints[f.name], f.metadata.get("packed"))))
    return out


@cache
def _packed_fields(cls: Any) -> list[tuple[str, type[PackedArray]]]:
    return [(f.name, f.metadata["packed"]) for f in dataclasses.fields(cls) if "packed" in f.metadata]


def _to_bytes(v: PackedArray) -> bytes:
    return v.to_bytes()


def _field_codec(
    hint: Any, kind: type[PackedArray] | None
) -> tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]:
    if kind is not None:
        return _to_bytes, kind
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        enum_cls = hint
        return (lambda v: enum_cls(v).value), enum_cls
    if origin is tuple and args and dataclasses.is_dataclass(args[0]):
        item: Any = args[0]
        return (lambda v: [_to_record(x) for x in v]), (lambda v: tuple(_from_record(item, x) for x in v))
    if origin is tuple:
        return list, tuple
    if origin is dict:
        return dict, dict
    return None, None


def _to_record(obj: Any) -> dict[str, Any]:
    try:
        return {
            avro: getattr(obj, attr) if enc is None else enc(getattr(obj, attr))
            for attr, avro, enc, _ in _converters(obj.__class__)
        }
    except (TypeError, ValueError) as e:
        raise EncodeError(f"{type(obj).__name__}: {e}") from e


def _from_record(cls: Any, record: dict[str, Any]) -> Any:
    """Builds the dataclass without running __init__: the reader schema guarantees every field and its
    type, and packed fields are already wrapped, so the hot decode path skips the checks of __init__."""
    try:
        values = {attr: record[avro] if dec is None else dec(record[avro]) for attr, avro, _, dec in _converters(cls)}
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"{cls.__name__}: {type(e).__name__}: {e}") from e
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


def encode_event(event: Event) -> bytes:
    """Single-object Avro encoding of an event with the current schema of its type."""
    return default_registry().encode(event.event_type, event.to_avro())


def decode_event(data: bytes) -> Event:
    """Decodes any released version of any event into its current dataclass."""
    name, record = default_registry().decode(data)
    try:
        cls = EVENT_TYPES[name]
    except KeyError:
        raise DecodeError(f"schema {name} has no event class") from None
    return cls.from_avro(record)
