"""Event docs have one source, the `.avsc` files: every record and field is documented there, and the
classes carry exactly those docs (no second prose copy in the dataclasses to drift from it)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from typing import Any

import pytest

from schemas import events as ev
from schemas.registry import named_records

pytestmark = pytest.mark.unit


def _fields_of(schema: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, field) of every field of a record, nested records included."""
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, list):
        for branch in schema:
            out += _fields_of(branch, where)
    elif isinstance(schema, dict) and schema.get("type") == "record":
        for f in schema["fields"]:
            out.append((f"{where}.{f['name']}", f))
            out += _fields_of(f["type"], f"{where}.{f['name']}")
    elif isinstance(schema, dict):
        out += _fields_of(schema.get("items"), where)
    return out


def test_every_avsc_record_and_field_has_a_doc() -> None:
    records = named_records()
    assert set(ev.RECORD_TYPES) <= set(records)
    undocumented = [name for name, d in records.items() if not d.get("doc", "").strip()]
    fields = [(path, f) for name, d in records.items() for path, f in _fields_of(d, name)]
    undocumented += [path for path, f in fields if not f.get("doc", "").strip()]
    assert undocumented == []


@pytest.mark.parametrize("name", sorted(ev.RECORD_TYPES))
def test_class_docs_are_the_avsc_docs(name: str) -> None:
    cls = ev.RECORD_TYPES[name]
    definition = named_records()[name]
    assert cls.__doc__ == definition["doc"]
    avro_to_attr = {avro: attr for attr, avro in cls.AVRO_NAMES.items()}
    expected = {avro_to_attr.get(f["name"], f["name"]): f["doc"] for f in definition["fields"]}
    assert dict(cls.FIELD_DOCS) == expected
    assert {f.name for f in dataclasses.fields(cls)} <= set(cls.FIELD_DOCS)


def test_event_classes_repeat_no_docstring_of_their_own() -> None:
    """A docstring in the source would hide behind the avsc one; the classes are declared bare."""
    for cls in ev.RECORD_TYPES.values():
        tree = ast.parse(inspect.getsource(cls))
        node = tree.body[0]
        assert isinstance(node, ast.ClassDef)
        assert ast.get_docstring(node) is None, cls.__name__
