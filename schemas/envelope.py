"""The envelope every event shares, and the mapping between event dataclasses and Avro records.

Events are facts: immutable, named in the past tense or as commands, each with the envelope
(`event_id`, `ts_ms`, `producer`, `correlation_id`; `event_type` is the class name). Packed token
payloads are held as `PackedArray`s (tuple-like, numpy-backed; see `schemas.packed`): pass a tuple,
list or numpy array and it is converted; a decoded event wraps the message bytes without a copy.
Float32 fields round to float32 when the event is built, so a round trip is exact.

The conversion is derived from each dataclass's type hints once (`_converters`), so an event family
declares only its fields; the docs of a record and of its fields live in its `.avsc` file and are set
on the class by `schemas.events` (one source of truth).
"""

from __future__ import annotations

import dataclasses
import enum
import time
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, TypeVar

from schemas.avro_binary import Binding
from schemas.errors import DecodeError, EncodeError
from schemas.packed import PackedArray

E = TypeVar("E", bound="Event")


def new_event_id() -> str:
    return uuid.uuid4().hex


def now_ms() -> int:
    return int(time.time() * 1000)


def packed(kind: type[PackedArray]) -> Any:
    """A token payload field: written as packed little-endian bytes, held as a `PackedArray`."""
    return field(default=kind(), metadata={"packed": kind})


class Record:
    """A dataclass written as one Avro record (an event or a record nested in one).

    Converts tuples, lists or numpy arrays given for packed fields into their `PackedArray`.
    """

    #: Python attribute -> Avro field, where a name would clash with the envelope (`key` is a property).
    AVRO_NAMES: ClassVar[Mapping[str, str]] = {}
    #: Python attribute -> the field's `doc` in the `.avsc` file (set by `schemas.events`).
    FIELD_DOCS: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        cls: Any = self.__class__
        for name, kind in _packed_fields(cls):
            value = getattr(self, name)
            if type(value) is not kind:
                object.__setattr__(self, name, kind(value))


@dataclass(frozen=True, kw_only=True)
class Event(Record):
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


_Converter = tuple[str, str, Callable[[Any], Any] | None, Callable[[Any], Any] | None]


@cache
def _converters(cls: Any) -> list[_Converter]:
    """(attribute, avro field, to-avro, from-avro) per field, derived once from the type hints;
    None where the value passes through unchanged (most fields: kept off the hot path)."""
    hints = typing.get_type_hints(cls)
    out: list[_Converter] = []
    for f in dataclasses.fields(cls):
        avro_name = cls.AVRO_NAMES.get(f.name, f.name)
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
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        enum_cls = hint
        return (lambda v: enum_cls(v).value), enum_cls
    item = _record_items(hint)
    if item is not None:
        return (lambda v: [_to_record(x) for x in v]), (lambda v: tuple(_from_record(item, x) for x in v))
    if origin is tuple:
        return list, tuple
    if origin is dict:
        return dict, dict
    return None, None


def _to_record(obj: Any) -> dict[str, Any]:
    try:
        return _codecs(obj.__class__)[0](obj)
    except (TypeError, ValueError) as e:
        raise EncodeError(f"{type(obj).__name__}: {e}") from e


def _from_record(cls: Any, record: dict[str, Any]) -> Any:
    """Builds the dataclass without running __init__: the reader schema guarantees every field and its
    type, and packed fields are already wrapped, so the hot decode path skips the checks of __init__."""
    try:
        return _codecs(cls)[1](record)
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"{cls.__name__}: {type(e).__name__}: {e}") from e


@cache
def avro_binding(cls: Any) -> Binding:
    """How the compiled Avro codec (`schemas.avro_binary`) writes and reads `cls`'s objects directly: the
    same attributes and converters as `to_avro`/`from_avro`, and an event's `event_type` as a constant."""
    hints = typing.get_type_hints(cls)
    fields, nested = {}, {}
    for attr, avro, enc, dec in _converters(cls):
        item = _record_items(hints[attr])
        if item is None:
            fields[avro] = (attr, enc, dec)
        else:  # a tuple of records: the codec writes and reads the item objects themselves
            fields[avro], nested[item.__name__] = (attr, None, tuple), avro_binding(item)
    constants = {"event_type": cls.__name__} if issubclass(cls, Event) else {}
    return Binding(cls, fields, constants, nested)


def _record_items(hint: Any) -> Any:
    """The record class of a `tuple[SomeRecord, ...]` field, else None."""
    args = typing.get_args(hint)
    return args[0] if typing.get_origin(hint) is tuple and args and dataclasses.is_dataclass(args[0]) else None


@cache
def _codecs(cls: Any) -> tuple[Callable[[Any], dict[str, Any]], Callable[[dict[str, Any]], Any]]:
    """The record <-> dataclass functions of a class, compiled once from its converters: one dict literal
    each way instead of a loop over (attribute, field, converter) tuples, which was most of the typed
    codec's cost around fastavro (bench/bus_bench.py, "full event path")."""
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    to_items, from_items = [], []
    for i, (attr, avro, enc, dec) in enumerate(_converters(cls)):
        scope[f"_e{i}"], scope[f"_d{i}"] = enc, dec
        value = f"obj.{attr}"
        to_items.append(f"{avro!r}: {value if enc is None else f'_e{i}({value})'}")
        item = f"record[{avro!r}]"
        from_items.append(f"{attr!r}: {item if dec is None else f'_d{i}({item})'}")
    source = (f"def to_record(obj):\n    return {{{', '.join(to_items)}}}\n"
              f"def from_record(record):\n    values = {{{', '.join(from_items)}}}\n"
              "    obj = _new(_cls)\n    obj.__dict__.update(values)\n    return obj\n")
    exec(compile(source, f"<record codec of {cls.__name__}>", "exec"), scope)
    return scope["to_record"], scope["from_record"]
