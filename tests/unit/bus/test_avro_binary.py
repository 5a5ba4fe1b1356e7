"""The compiled Avro codec (schemas.avro_binary) against fastavro: the same bytes and the same records.

On random records of every released schema version (generated from the schema itself: unicode, long
strings, extreme longs, NaN and infinities), the compiled encoder writes exactly fastavro's bytes and the
compiled decoder reads exactly fastavro's record; on random events of every event class, the bound codec
(event object <-> bytes, what encode_event/decode_event use) agrees with the fastavro path. A corrupted
message is either read as fastavro reads it or handed to fastavro (Fallback), never misread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import events as ev
from schemas.avro_binary import Fallback, compile_codec
from schemas.envelope import avro_binding
from schemas.errors import SchemaError
from schemas.registry import HEADER_LEN, SchemaVersion, default_registry
from tests.factories import ALL_EVENT_TYPES, example
from tests.unit.bus.test_schemas import _record_strategy

pytestmark = pytest.mark.unit

VERSIONS = [v for name in default_registry().names for v in default_registry().versions(name)]
_TEXT = st.text(max_size=12) | st.text(min_size=60, max_size=200)  # one- and two-byte length prefixes
_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
_PRIMITIVE = {
    "null": st.none(), "boolean": st.booleans(), "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1) | st.integers(-200, 200), "float": st.floats(width=32),
    "double": _FLOATS, "bytes": st.binary(max_size=20) | st.binary(min_size=64, max_size=9000), "string": _TEXT,
}


def _strategy(schema: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Random values of a parsed Avro schema (named types referenced by name are looked up in `named`)."""
    if isinstance(schema, str):
        return _PRIMITIVE[schema] if schema in _PRIMITIVE else st.deferred(lambda: _strategy(named[schema], named))
    if isinstance(schema, list):
        return st.one_of([_strategy(branch, named) for branch in schema])
    kind = schema["type"]
    if kind in _PRIMITIVE:
        return _PRIMITIVE[kind]
    if kind == "enum":
        named[schema["name"]] = schema
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(_strategy(schema["items"], named), max_size=3)
    if kind == "map":
        return st.dictionaries(_TEXT, _strategy(schema["values"], named), max_size=3)
    named[schema["name"]] = schema
    fields = {f["name"]: _strategy(f["type"], named) for f in schema["fields"]}
    return st.fixed_dictionaries(fields)


def _fastavro_bytes(version: SchemaVersion, record: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, version.parsed, record, strict=True)
    return buf.getvalue()


def test_every_shipped_schema_and_event_class_is_compiled() -> None:
    assert all(v.compiled is not None for v in VERSIONS)
    for cls in ALL_EVENT_TYPES:
        binding = avro_binding(cls)  # type: ignore[arg-type]
        assert compile_codec(default_registry().current(cls.__name__).parsed, binding) is not None


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"{v.name}.v{v.version}")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_compiled_codec_writes_and_reads_what_fastavro_does(version: SchemaVersion, data: st.DataObject) -> None:
    record = data.draw(_strategy(version.parsed, {}))
    assert version.compiled is not None
    encode, decode = version.compiled
    expected = _fastavro_bytes(version, record)
    assert encode(record) == expected
    read_back = fastavro.schemaless_reader(io.BytesIO(expected), version.parsed, None)
    assert repr(decode(expected, 0)) == repr(read_back)  # repr: NaN equals NaN


@pytest.mark.parametrize("cls", ALL_EVENT_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_bound_event_codec_agrees_with_the_fastavro_path(cls: Any, data: st.DataObject) -> None:
    current = default_registry().current(cls.__name__)
    event = data.draw(_record_strategy(cls, dict(current.definition)))
    expected = current.header + _fastavro_bytes(current, event.to_avro())
    assert ev.encode_event(event) == expected
    record: Any = fastavro.schemaless_reader(io.BytesIO(expected[HEADER_LEN:]), current.parsed, None)
    fastavro_read = cls.from_avro(record)
    decoded = ev.decode_event(expected)
    assert type(decoded) is cls and decoded == fastavro_read == event


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_corrupted_message_is_read_as_fastavro_reads_it_or_refused(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(ALL_EVENT_TYPES))
    message = bytearray(ev.encode_event(example(cls)))
    at = data.draw(st.integers(HEADER_LEN, len(message) - 1))
    message[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        message = message[: data.draw(st.integers(HEADER_LEN, len(message)))]
    current = default_registry().current(cls.__name__)
    assert current.compiled is not None
    try:
        compiled: Any = current.compiled[1](bytes(message), HEADER_LEN)
    except Fallback:
        compiled = Fallback
    try:
        body = io.BytesIO(bytes(message[HEADER_LEN:]))
        expected: Any = fastavro.schemaless_reader(body, current.parsed, None)
        if body.tell() != len(message) - HEADER_LEN:
            expected = Fallback  # trailing bytes: refused
    except Exception:  # fastavro refuses bad bodies with many types
        expected = Fallback
    assert compiled is Fallback or repr(compiled) == repr(expected)
    with contextlib.suppress(SchemaError):  # refused with the package's error, as before
        ev.decode_event(bytes(message))


def test_a_value_the_compiled_codec_does_not_take_goes_through_fastavro() -> None:
    ended = example(ev.SessionEnded)
    current = default_registry().current("SessionEnded")
    record = ended.to_avro()
    record["reward"] = 3  # an int where a double goes: fastavro writes it as 3.0
    assert current.compiled is not None
    with pytest.raises(Fallback):
        current.compiled[0](record)
    assert default_registry().encode("SessionEnded", record) == current.header + _fastavro_bytes(current, record)
    event = dataclasses.replace(ended, reward=3)
    assert ev.encode_event(event) == current.header + _fastavro_bytes(current, record)
    decoded: Any = ev.decode_event(ev.encode_event(event))
    assert decoded.reward == 3.0
