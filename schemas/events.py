"""The public registry of events: every event class, `encode_event` and `decode_event`.

Import events from here (`from schemas.events import LLMCall`): the classes are declared by family
(`schemas.rollout_events`, `scheduling_events`, `weight_events`, `training_events`, `ops_events`) on the
envelope and record mapping of `schemas.envelope`. Their docs are not written twice: each class's
`__doc__` and its `FIELD_DOCS` (attribute -> doc) are set here from its `.avsc` file, the source of truth.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from schemas.avro_binary import Decoder, Encoder, Fallback, compile_codec
from schemas.envelope import Event, Record, avro_binding, new_event_id, now_ms, packed
from schemas.errors import DecodeError
from schemas.ops_events import DeadLetter, MetricSample
from schemas.registry import HEADER_LEN, default_registry, named_records
from schemas.rollout_events import (
    BatchReady,
    LLMCall,
    Segment,
    SessionEnded,
    SessionStarted,
    SessionStatus,
    TaskCompleted,
    TaskDispatched,
    Trajectory,
    TrajectoryNode,
)
from schemas.scheduling_events import (
    Assignment,
    Heartbeat,
    Preemption,
    ResourceLost,
    ResourceRegistered,
    SchedulerCheckpoint,
    SchedulerObserved,
    TagKind,
    TagTransition,
)
from schemas.training_events import EvalCompleted, TrainData, TrainStepCompleted, TrainStepStarted
from schemas.weight_events import (
    ControlAck,
    LoadWeights,
    PauseMode,
    PauseRollout,
    ResumeRollout,
    WeightsLoaded,
    WeightsPublished,
    WeightSyncCompleted,
    WeightSyncStarted,
)

__all__ = [
    "EVENT_TYPES", "RECORD_TYPES", "Assignment", "BatchReady", "ControlAck", "DeadLetter", "EvalCompleted", "Event",
    "Heartbeat",
    "LLMCall", "LoadWeights", "MetricSample", "PauseMode", "PauseRollout", "Preemption", "Record", "ResourceLost",
    "ResourceRegistered", "ResumeRollout", "SchedulerCheckpoint", "SchedulerObserved", "Segment", "SessionEnded",
    "SessionStarted", "SessionStatus", "TagKind", "TagTransition", "TaskCompleted", "TaskDispatched", "TrainData",
    "TrainStepCompleted", "TrainStepStarted", "Trajectory", "TrajectoryNode", "WeightSyncCompleted",
    "WeightSyncStarted", "WeightsLoaded", "WeightsPublished", "decode_event", "encode_event", "new_event_id",
    "now_ms", "packed",
]

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        LLMCall, SessionStarted, SessionEnded, Trajectory, BatchReady, TaskDispatched, TaskCompleted,
        ResourceRegistered, Heartbeat, ResourceLost, TagTransition, Preemption, Assignment,
        PauseRollout, ResumeRollout, LoadWeights, ControlAck, WeightsPublished, WeightsLoaded,
        TrainStepStarted, TrainStepCompleted, MetricSample, DeadLetter,
        SchedulerObserved, SchedulerCheckpoint, TrainData, WeightSyncStarted, WeightSyncCompleted, EvalCompleted,
    )
}

#: Every class written as an Avro record: the events and the records nested in them.
RECORD_TYPES: dict[str, type[Record]] = {**EVENT_TYPES, "Segment": Segment, "TrajectoryNode": TrajectoryNode}


def _set_docs_from_avsc() -> None:
    """Each record class's `__doc__` and `FIELD_DOCS` from its `.avsc` definition (missing docs stay empty:
    tests/unit/bus/test_event_docs.py refuses them)."""
    for name, definition in named_records().items():
        cls: Any = RECORD_TYPES.get(name)
        if cls is None:
            continue
        attribute = {avro: attr for attr, avro in cls.AVRO_NAMES.items()}
        cls.__doc__ = definition.get("doc", "")
        cls.FIELD_DOCS = {attribute.get(f["name"], f["name"]): f.get("doc", "") for f in definition["fields"]}


_set_docs_from_avsc()


@cache
def _bound_codec(cls: Any) -> tuple[Encoder, Decoder, bytes] | None:
    """The compiled codec of `cls`'s current schema bound to the class (the event's bytes straight from its
    attributes and back: `schemas.avro_binary`) and the schema's header; None where it is not compiled."""
    current = default_registry().current(cls.__name__)
    codec = compile_codec(current.parsed, avro_binding(cls))
    return None if codec is None else (*codec, current.header)


#: Header (magic + fingerprint) of a current schema -> its bound decoder, filled as messages arrive.
_DECODERS: dict[bytes, Decoder] = {}


def encode_event(event: Event) -> bytes:
    """Single-object Avro encoding of an event with the current schema of its type."""
    cls: Any = type(event)
    codec = _bound_codec(cls)
    if codec is not None:
        try:
            return codec[0](event, codec[2])
        except Fallback:
            pass  # what the compiled codec does not take: the dict path encodes it or names what is wrong
    return default_registry().encode(event.event_type, event.to_avro())


def decode_event(data: bytes) -> Event:
    """Decodes any released version of any event into its current dataclass."""
    data = data if type(data) is bytes else bytes(data)
    decoder = _DECODERS.get(data[:HEADER_LEN]) or _decoder_of(data)
    if decoder is not None:
        try:
            return decoder(data, HEADER_LEN)
        except Fallback:
            pass  # fastavro reads it, or names what is wrong
    name, record = default_registry().decode(data)
    try:
        event_cls = EVENT_TYPES[name]
    except KeyError:
        raise DecodeError(f"schema {name} has no event class") from None
    return event_cls.from_avro(record)


def _decoder_of(data: bytes) -> Decoder | None:
    """The bound decoder of the message's writer schema when it is the current one (remembered), else None;
    raises the header's errors."""
    registry = default_registry()
    writer = registry.writer_of(data)
    cls: Any = EVENT_TYPES.get(writer.name)
    if cls is None or writer is not registry.current(writer.name) or (codec := _bound_codec(cls)) is None:
        return None
    _DECODERS[writer.header] = codec[1]
    return codec[1]
