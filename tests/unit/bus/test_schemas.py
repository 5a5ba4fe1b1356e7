"""Schemas without a broker: fingerprints, framing, packed payloads, round trips, evolution, bad input."""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastavro.schema import fingerprint as fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import events as ev
from schemas.errors import (
    BadMagicError,
    DecodeError,
    EncodeError,
    SchemaDefinitionError,
    SchemaError,
    TruncatedMessageError,
    UnknownFingerprintError,
)
from schemas.packed import FLOAT32, INT32, UINT8, Float32s, Int32s, PackedArray, UInt8s, pack, unpack, unpack_tuple
from schemas.registry import HISTORY_DIR, MAGIC, SchemaRegistry, crc64_avro, default_registry, fingerprint
from tests.factories import ALL_EVENT_TYPES, example

pytestmark = pytest.mark.unit

# CRC-64-AVRO fingerprints from the Avro project's own test vectors (signed 64-bit as Java prints them).
KNOWN_FINGERPRINTS = [
    ('"null"', 7195948357588979594),
    ('"boolean"', -6970731678124411036),
    ('"int"', 8247732601305521295),
    ('"long"', -3434872931120570953),
    ('"float"', 5583340709985441680),
    ('"double"', -8181574048448539266),
    ('"bytes"', 5746618253357095269),
    ('"string"', -8142146995180207161),
    ('["int"]', -5232228896498058493),
    ('["int","boolean"]', 5392556393470105090),
    ('{"name":"x.y.foo","type":"record","fields":[]}', 5916914534497305771),
    ('{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"}]}', 7843277075252814651),
    ('{"name":"foo","type":"enum","symbols":["A1"]}', -6342190197741309591),
    ('{"name":"x.y.z.foo","type":"fixed","size":32}', -3064184465700546786),
    ('{"type":"map","values":"string"}', -8732877298790414990),
]


@pytest.mark.parametrize(("schema", "expected"), KNOWN_FINGERPRINTS)
def test_fingerprint_matches_avro_spec_vectors(schema: str, expected: int) -> None:
    assert fingerprint(schema) == expected & 0xFFFFFFFFFFFFFFFF


def test_fingerprint_agrees_with_fastavro_for_every_event_schema() -> None:
    registry = default_registry()
    for name in registry.names:
        current = registry.current(name)
        canonical = to_parsing_canonical_form(current.definition)
        # fastavro prints the fingerprint as its little-endian bytes, as the single-object header holds it
        assert current.fingerprint.to_bytes(8, "little").hex() == fastavro_fingerprint(canonical, "CRC-64-AVRO")


def test_crc64_of_empty_input_is_the_spec_seed() -> None:
    assert crc64_avro(b"") == 0xC15D213AA4D7A795


def test_single_object_framing() -> None:
    event = example(ev.ResourceLost)
    data = ev.encode_event(event)
    current = default_registry().current("ResourceLost")
    assert data[:2] == MAGIC == b"\xc3\x01"
    assert int.from_bytes(data[2:10], "little") == current.fingerprint
    assert default_registry().writer_of(data) is current


def test_packed_tokens_round_trip_and_are_little_endian() -> None:
    ids = list(range(-3, 2000))
    data = pack(ids, INT32)
    assert data[:4] == (-3).to_bytes(4, "little", signed=True)
    assert unpack_tuple(data, INT32) == tuple(ids)
    view = unpack(data, INT32)
    assert not view.flags.writeable  # numpy reads the bytes without a copy
    logprobs = np.float32([-0.125, -3.5, 0.0])
    assert unpack(pack(logprobs, FLOAT32), FLOAT32).tolist() == logprobs.tolist()
    assert unpack_tuple(pack([0, 1, 1], UINT8), UINT8) == (0, 1, 1)


@pytest.mark.parametrize("bad", [[2**31], [-(2**31) - 1]])
def test_packed_int32_refuses_out_of_range(bad: list[int]) -> None:
    with pytest.raises(EncodeError, match="out of range"):
        pack(bad, INT32)


def test_packed_array_is_a_zero_copy_tuple_like_view() -> None:
    raw = pack([5, 6, 7], INT32)
    ids = Int32s(raw)
    assert ids.to_bytes() is raw and np.asarray(ids).base is not None
    assert ids == (5, 6, 7) and ids == Int32s([5, 6, 7]) and list(ids) == [5, 6, 7]
    assert ids[1] == 6 and ids[1:] == (6, 7) and len(ids) == 3
    assert ids + (8,) == (5, 6, 7, 8)  # noqa: RUF005 -- concatenation, as for tuples
    assert Float32s([0.1]) == (float(np.float32(0.1)),)  # rounded to float32 when built
    with pytest.raises(EncodeError, match="integers"):
        Int32s([1.5])
    event = example(ev.LLMCall, prompt_ids=[1, 2], output_ids=np.array([3], dtype=np.int64))
    assert type(event.prompt_ids) is Int32s and event.output_ids == (3,)


def test_packed_rejects_ragged_bytes() -> None:
    with pytest.raises(DecodeError, match="multiple of 4"):
        unpack(b"\x00\x01\x02", INT32)


# --- property-based round trip of every event type ------------------------------------------

_INT32 = st.integers(-(2**31), 2**31 - 1)
_LONG = st.integers(-(2**63), 2**63 - 1)
_F32 = st.floats(width=32, allow_nan=False)
_TEXT = st.text(max_size=12)


def _avro_types(definition: dict[str, Any]) -> dict[str, Any]:
    return {f["name"]: f["type"] for f in definition["fields"]}


def _strategy(hint: Any, avro_type: Any, packed: type[PackedArray] | None) -> st.SearchStrategy[Any]:
    if packed is Float32s:
        return st.lists(_F32, max_size=20).map(tuple)
    if packed is UInt8s:
        return st.lists(st.integers(0, 1), max_size=20).map(tuple)
    if packed is Int32s:
        return st.lists(_INT32, max_size=20).map(tuple)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    if origin is tuple and args and dataclasses.is_dataclass(args[0]):
        item = args[0]
        return st.lists(_record_strategy(item, avro_type["items"]), max_size=3).map(tuple)
    if origin is tuple:
        inner = avro_type["items"]
        items = {"string": _TEXT, "double": st.floats(allow_nan=False)}.get(inner, _LONG)
        return st.lists(items, max_size=4).map(tuple)
    if origin is dict:
        return st.dictionaries(_TEXT, _TEXT, max_size=3)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return _INT32 if avro_type == "int" else _LONG
    if hint is float:
        return st.floats(allow_nan=False)
    if hint is str:
        return _TEXT
    return st.none() | st.binary(max_size=16)


def _record_strategy(cls: Any, definition: dict[str, Any]) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    types = _avro_types(definition)
    rename = {("DeadLetter", "key_bytes"): "key"}
    fields = {
        f.name: _strategy(hints[f.name], types[rename.get((cls.__name__, f.name), f.name)], f.metadata.get("packed"))
        for f in dataclasses.fields(cls)
    }
    return st.builds(cls, **fields)


@pytest.mark.parametrize("cls", ALL_EVENT_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_event_round_trips(cls: type[ev.Event], data: st.DataObject) -> None:
    definition = default_registry().current(cls.__name__).definition
    event = data.draw(_record_strategy(cls, dict(definition)))
    assert ev.decode_event(ev.encode_event(event)) == event


# --- evolution --------------------------------------------------------------------------------


def test_every_historical_writer_is_readable_by_the_current_reader() -> None:
    registry = default_registry()
    checked = 0
    for name in registry.names:
        cls = ev.EVENT_TYPES[name]
        for version in registry.versions(name):
            current_names = {f["name"] for f in version.definition["fields"]}
            record = example(cls).to_avro()
            old_record = {k: v for k, v in record.items() if k in current_names}
            data = registry.encode(name, old_record, version=version)
            decoded = ev.decode_event(data)
            assert type(decoded) is cls
            checked += 1
    assert checked > len(registry.names)  # at least one schema has an older version


def test_old_llmcall_gets_the_defaults_of_fields_added_since() -> None:
    registry = default_registry()
    v1 = registry.versions("LLMCall")[0]
    assert v1.version == 1 and v1 is not registry.current("LLMCall")
    call = example(ev.LLMCall, drift=True, parent_call_id="p")
    v1_fields = {f["name"] for f in v1.definition["fields"]}
    data = registry.encode("LLMCall", {k: v for k, v in call.to_avro().items() if k in v1_fields}, version=v1)
    decoded = ev.decode_event(data)
    assert isinstance(decoded, ev.LLMCall)
    assert decoded.drift is False and decoded.parent_call_id == ""
    assert decoded.prompt_ids == call.prompt_ids


def test_history_with_a_gap_is_refused(tmp_path: Path) -> None:
    avsc = tmp_path / "avsc"
    hist = tmp_path / "history"
    avsc.mkdir()
    hist.mkdir()
    schema = {"type": "record", "name": "X", "namespace": "t", "fields": [{"name": "a", "type": "int"}]}
    (avsc / "X.avsc").write_text(json.dumps(schema))
    (hist / "X.v2.avsc").write_text(json.dumps(schema))
    with pytest.raises(SchemaDefinitionError, match="without gaps"):
        SchemaRegistry(avsc, hist)


def test_shipped_history_files_parse() -> None:
    assert sorted(p.name for p in HISTORY_DIR.glob("*.avsc"))


# --- bad input ---------------------------------------------------------------------------------


def test_truncated_body_raises_named_error() -> None:
    data = ev.encode_event(example(ev.LLMCall))
    with pytest.raises(TruncatedMessageError, match="LLMCall"):
        ev.decode_event(data[:-5])


def test_truncated_header_raises() -> None:
    with pytest.raises(TruncatedMessageError, match="header"):
        ev.decode_event(b"\xc3\x01\x00\x01")


def test_unknown_fingerprint_raises() -> None:
    data = b"\xc3\x01" + (12345).to_bytes(8, "little") + b"\x00"
    with pytest.raises(UnknownFingerprintError, match="0x0000000000003039"):
        ev.decode_event(data)


def test_wrong_magic_raises() -> None:
    data = ev.encode_event(example(ev.Heartbeat))
    with pytest.raises(BadMagicError, match="c301"):
        ev.decode_event(b"\x00\x00" + data[2:])


def test_trailing_garbage_raises() -> None:
    data = ev.encode_event(example(ev.Heartbeat))
    with pytest.raises(DecodeError, match="trailing"):
        ev.decode_event(data + b"\x00\x00")


def test_encoding_a_wrong_type_raises_encode_error() -> None:
    bad = dataclasses.replace(example(ev.Heartbeat), running_requests="many")  # type: ignore[arg-type]
    with pytest.raises(EncodeError):
        ev.encode_event(bad)


def test_all_errors_share_the_package_root() -> None:
    for err in (EncodeError, DecodeError, BadMagicError, TruncatedMessageError, UnknownFingerprintError):
        assert issubclass(err, SchemaError)
