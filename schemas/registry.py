"""Schema registry: the .avsc files, their CRC-64-AVRO fingerprints, and single-object encoding.

Every message on the bus is Avro single-object encoded (`C3 01`, the writer schema's 8-byte
little-endian CRC-64-AVRO fingerprint, then the Avro body), so a message names its writer schema
without a registry server. The registry holds the current schema of each event under `avsc/` and
every earlier released version under `history/NAME.vN.avsc`; decoding reads with the writer schema
and resolves to the current reader schema, which fills fields added since with their defaults.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Final

import fastavro
from fastavro.schema import to_parsing_canonical_form

from schemas.avro_binary import Decoder, Encoder, Fallback, compile_codec
from schemas.errors import (
    BadMagicError,
    DecodeError,
    EncodeError,
    SchemaDefinitionError,
    TruncatedMessageError,
    UnknownFingerprintError,
)

MAGIC: Final = b"\xc3\x01"
HEADER_LEN: Final = 10
NAMESPACE: Final = "seamlessflow.events"
AVSC_DIR: Final = Path(__file__).parent / "avsc"
HISTORY_DIR: Final = Path(__file__).parent / "history"

_CRC64_EMPTY: Final = 0xC15D213AA4D7A795


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_CRC64_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_TABLE: Final = _crc64_table()


def crc64_avro(data: bytes) -> int:
    """The Rabin fingerprint the Avro spec names CRC-64-AVRO, as an unsigned 64-bit integer."""
    fp = _CRC64_EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


def fingerprint(schema: Any) -> int:
    """CRC-64-AVRO of a schema's Parsing Canonical Form (schema as JSON text or parsed JSON)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError:
            schema = schema.strip('"')
    canonical = to_parsing_canonical_form(schema)
    return crc64_avro(canonical.encode("utf-8"))


@dataclass(frozen=True)
class SchemaVersion:
    """One released version of one event schema."""

    name: str
    version: int
    fingerprint: int
    definition: Mapping[str, Any]
    parsed: Any

    @cached_property
    def compiled(self) -> tuple[Encoder, Decoder] | None:
        """The compiled Avro codec of this version (`schemas.avro_binary`), None where it is not compiled;
        compiled on first use, so a process pays only for the schemas it writes or reads."""
        return compile_codec(self.parsed)

    @cached_property
    def header(self) -> bytes:
        return MAGIC + self.fingerprint.to_bytes(8, "little")


class SchemaRegistry:
    """All schema versions ever released, indexed by event name and by fingerprint."""

    def __init__(self, avsc_dir: Path = AVSC_DIR, history_dir: Path = HISTORY_DIR) -> None:
        self._current: dict[str, SchemaVersion] = {}
        self._versions: dict[str, list[SchemaVersion]] = {}
        self._by_fp: dict[int, SchemaVersion] = {}
        history = self._load_history(history_dir)
        for path in sorted(avsc_dir.glob("*.avsc")):
            definition = self._read(path)
            name = definition["name"]
            if name != path.stem:
                raise SchemaDefinitionError(f"{path}: record name {name!r} does not match the file name")
            old = history.get(name, [])
            expected = list(range(1, len(old) + 1))
            if [v for v, _ in old] != expected:
                raise SchemaDefinitionError(f"history of {name} must be v1..vN without gaps, got {old}")
            versions = [self._make(name, v, d) for v, d in old]
            current = self._make(name, len(old) + 1, definition)
            if any(v.fingerprint == current.fingerprint for v in versions):
                current = versions[-1]
            else:
                versions.append(current)
            self._current[name] = current
            self._versions[name] = versions
            for v in versions:
                self._by_fp[v.fingerprint] = v
        unknown = set(history) - set(self._current)
        if unknown:
            raise SchemaDefinitionError(f"history has schemas with no current version: {sorted(unknown)}")

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            definition = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SchemaDefinitionError(f"{path}: {e}") from e
        if not isinstance(definition, dict) or definition.get("type") != "record":
            raise SchemaDefinitionError(f"{path}: an event schema must be a record")
        return definition

    def _load_history(self, history_dir: Path) -> dict[str, list[tuple[int, dict[str, Any]]]]:
        found: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        pattern = re.compile(r"^(?P<name>\w+)\.v(?P<v>\d+)\.avsc$")
        for path in sorted(history_dir.glob("*.avsc")) if history_dir.exists() else []:
            m = pattern.match(path.name)
            if not m:
                raise SchemaDefinitionError(f"{path}: history files are named NAME.vN.avsc")
            found.setdefault(m["name"], []).append((int(m["v"]), self._read(path)))
        return {k: sorted(v, key=lambda t: t[0]) for k, v in found.items()}

    @staticmethod
    def _make(name: str, version: int, definition: dict[str, Any]) -> SchemaVersion:
        try:
            parsed = fastavro.parse_schema(definition, _force=True)
        except Exception as e:  # fastavro raises several unrelated types for a bad schema
            raise SchemaDefinitionError(f"{name} v{version}: {e}") from e
        return SchemaVersion(name, version, fingerprint(definition), definition, parsed)

    @property
    def names(self) -> list[str]:
        return sorted(self._current)

    def current(self, name: str) -> SchemaVersion:
        try:
            return self._current[name]
        except KeyError:
            raise SchemaDefinitionError(f"no schema named {name!r}; known: {self.names}") from None

    def versions(self, name: str) -> list[SchemaVersion]:
        self.current(name)
        return list(self._versions[name])

    def by_fingerprint(self, fp: int) -> SchemaVersion:
        try:
            return self._by_fp[fp]
        except KeyError:
            raise UnknownFingerprintError(f"unknown writer schema fingerprint {fp:#018x}") from None

    def encode(self, name: str, record: Mapping[str, Any], version: SchemaVersion | None = None) -> bytes:
        """Single-object encoding of `record` with the current schema of `name` (or `version`)."""
        writer = version or self.current(name)
        if writer.compiled is not None:
            try:
                return writer.compiled[0](record, writer.header)
            except Fallback:
                pass  # fastavro encodes it, or names what is wrong
        buf = io.BytesIO()
        buf.write(writer.header)
        try:
            fastavro.schemaless_writer(buf, writer.parsed, record, strict=True)
        except (ValueError, TypeError, KeyError, OverflowError) as e:
            raise EncodeError(f"{name}: {e}") from e
        return buf.getvalue()

    def decode(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """Reads any released version and resolves it to the current schema of its event."""
        writer = self.writer_of(data)
        reader = self._current[writer.name]
        if writer is reader and writer.compiled is not None:
            try:
                return writer.name, writer.compiled[1](data if type(data) is bytes else bytes(data), HEADER_LEN)
            except Fallback:
                pass  # fastavro reads it, or names what is wrong
        body = io.BytesIO(memoryview(data)[HEADER_LEN:])
        try:
            if writer is reader:
                record = fastavro.schemaless_reader(body, writer.parsed, None)
            else:
                record = fastavro.schemaless_reader(body, writer.parsed, reader.parsed)
        except EOFError as e:
            raise TruncatedMessageError(f"{writer.name} v{writer.version}: body ends early") from e
        except Exception as e:  # fastavro signals bad bodies with many types
            raise DecodeError(f"{writer.name} v{writer.version}: {type(e).__name__}: {e}") from e
        if body.tell() != len(data) - HEADER_LEN:
            raise DecodeError(
                f"{writer.name} v{writer.version}: {len(data) - HEADER_LEN - body.tell()} trailing bytes"
            )
        if not isinstance(record, dict):
            raise DecodeError(f"{writer.name}: body is not a record")
        return writer.name, record

    def writer_of(self, data: bytes) -> SchemaVersion:
        """The writer schema a message names in its header."""
        if len(data) < 2 or data[:2] != MAGIC:
            if len(data) < 2 and MAGIC.startswith(bytes(data)):
                raise TruncatedMessageError(f"message of {len(data)} bytes has no header")
            raise BadMagicError(f"message starts with {bytes(data[:2]).hex()!r}, not c301")
        if len(data) < HEADER_LEN:
            raise TruncatedMessageError(f"header needs {HEADER_LEN} bytes, message has {len(data)}")
        return self.by_fingerprint(int.from_bytes(data[2:HEADER_LEN], "little"))


@cache
def default_registry() -> SchemaRegistry:
    """The registry of the schemas shipped with this package (built once per process)."""
    return SchemaRegistry()


def _records_in(schema: Any) -> list[dict[str, Any]]:
    """The named records of a schema: itself when it is one, and every record nested in its fields."""
    if isinstance(schema, list):
        return [r for branch in schema for r in _records_in(branch)]
    if not isinstance(schema, dict):
        return []
    if schema.get("type") == "record":
        return [schema, *(r for f in schema.get("fields", ()) for r in _records_in(f.get("type")))]
    return _records_in(schema.get("items")) + _records_in(schema.get("values"))


@cache
def named_records(avsc_dir: Path = AVSC_DIR) -> dict[str, dict[str, Any]]:
    """Record name -> definition of every record in the current schemas, nested ones included (their
    `doc`s are the event classes' docs). Read from the files alone: cheaper than building the registry."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(avsc_dir.glob("*.avsc")):
        for record in _records_in(SchemaRegistry._read(path)):
            found.setdefault(record["name"], record)
    return found
