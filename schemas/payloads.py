"""Typed records for the JSON text some events carry in a string field.

Avro types an event's own fields; a few fields hold JSON whose shape is set by the services that write
and read it (a dataset row, an assignment's instructions). Each such field has one record here, with
`to_json` (canonical: sorted keys, no spaces, so equal records give equal text) and `from_json`, which
validates and names the field in its `PayloadError`. Producer and consumer both use the record, so the
shape is written down once and a typo'd key is an error instead of a silently empty payload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from schemas.errors import PayloadError

T = TypeVar("T")


def _canonical(value: Any, where: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise PayloadError(f"{where}: not JSON-serialisable: {e}") from e


def _object(text: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as e:
        raise PayloadError(f"{where}={text[:80]!r}: not JSON ({e})") from e
    if not isinstance(value, dict):
        raise PayloadError(f"{where}={text[:80]!r}: a JSON object is required, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class TaskPayload:
    """`TaskDispatched.payload`: the task's row of the dataset (prompt, the verifier's answer, ...).

    Its fields are the dataset's, not the framework's: the example that wrote the tasks file reads them
    back with `get`, which names the missing or mistyped field.
    """

    fields: Mapping[str, Any] = field(default_factory=dict)

    WHERE = "TaskDispatched.payload"

    def to_json(self) -> str:
        return _canonical(dict(self.fields), self.WHERE)

    @classmethod
    def from_json(cls, text: str) -> TaskPayload:
        return cls(_object(text, cls.WHERE))

    def get(self, name: str, kind: type[T]) -> T:
        """The field `name` as a `kind` (an int is taken for a float); `PayloadError` if absent or another type."""
        if name not in self.fields:
            raise PayloadError(f"{self.WHERE}: no field {name!r} (fields: {sorted(self.fields)})")
        value = self.fields[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise PayloadError(f"{self.WHERE}.{name}={value!r}: a {kind.__name__} is required")
        return value


@dataclass(frozen=True)
class AssignmentPayload:
    """`Assignment.payload`: why the scheduler assigned the task and what it hands the resources.

    `group_ids` is None when the groups arrive as `TrainData` events (the scheduler's train steps);
    a list names them in the assignment itself, with `final` False when `TrainData` adds more.
    Assignments written before `group_ids`/`final` existed read with their defaults.
    """

    cause: str = ""
    work: tuple[str, ...] = ()
    run_id: str = ""
    group_ids: tuple[str, ...] | None = None
    final: bool = True
    #: a cost-aware decision's estimates (benefit vs cost); written only when set, so older readers
    #: and the canonical text of assignments without one are unchanged
    reason: str = ""

    WHERE = "Assignment.payload"

    def to_json(self) -> str:
        data = {
            "cause": self.cause, "work": list(self.work), "run_id": self.run_id,
            "group_ids": None if self.group_ids is None else list(self.group_ids), "final": self.final,
        }
        if self.reason:
            data["reason"] = self.reason
        return _canonical(data, self.WHERE)

    @classmethod
    def from_json(cls, text: str) -> AssignmentPayload:
        data = _object(text, cls.WHERE)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PayloadError(f"{cls.WHERE}: unknown field(s) {unknown} (known: {sorted(known)})")
        return cls(
            cause=_typed(data, "cause", str, "", cls.WHERE),
            work=_strings(data, "work", cls.WHERE, allow_empty=True) or (),
            run_id=_typed(data, "run_id", str, "", cls.WHERE),
            group_ids=_strings(data, "group_ids", cls.WHERE),
            final=_typed(data, "final", bool, True, cls.WHERE),
            reason=_typed(data, "reason", str, "", cls.WHERE),
        )


def _typed(data: Mapping[str, Any], name: str, kind: type[T], default: T, where: str) -> T:
    value = data.get(name, default)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise PayloadError(f"{where}.{name}={value!r}: a {kind.__name__} is required")
    return value


def _strings(data: Mapping[str, Any], name: str, where: str, allow_empty: bool = False) -> tuple[str, ...] | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and (v or allow_empty) for v in value):
        kind = "strings" if allow_empty else "non-empty strings"
        raise PayloadError(f"{where}.{name}={value!r}: a list of {kind} is required")
    return tuple(value)
