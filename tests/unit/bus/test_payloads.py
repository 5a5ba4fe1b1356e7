"""The JSON payloads inside events: one shape each, canonical text, and refusals that name the field."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.errors import PayloadError
from schemas.payloads import AssignmentPayload, TaskPayload

pytestmark = pytest.mark.unit

_IDS = st.lists(st.text(min_size=1, max_size=8), max_size=4).map(tuple)


@given(cause=st.text(max_size=10), work=st.lists(st.text(max_size=8), max_size=4).map(tuple),
       run_id=st.text(max_size=8), group_ids=st.none() | _IDS, final=st.booleans())
def test_assignment_payload_round_trips(cause: str, work: tuple[str, ...], run_id: str,
                                        group_ids: tuple[str, ...] | None, final: bool) -> None:
    payload = AssignmentPayload(cause=cause, work=work, run_id=run_id, group_ids=group_ids, final=final)
    assert AssignmentPayload.from_json(payload.to_json()) == payload


def test_assignment_payload_text_is_canonical() -> None:
    text = AssignmentPayload(cause="train_step", work=("g1",), run_id="r").to_json()
    assert text == '{"cause":"train_step","final":true,"group_ids":null,"run_id":"r","work":["g1"]}'


def test_an_assignment_written_before_group_ids_reads_with_defaults() -> None:
    old = AssignmentPayload.from_json('{"cause":"rollout","run_id":"r","work":["g1","g2"]}')
    assert old == AssignmentPayload(cause="rollout", work=("g1", "g2"), run_id="r", group_ids=None, final=True)


@pytest.mark.parametrize(("text", "names"), [
    ("not json", "Assignment.payload='not json'"),
    ("[1]", "a JSON object is required"),
    ('{"groups": ["g1"]}', "unknown field(s) ['groups']"),
    ('{"group_ids": "g1"}', "Assignment.payload.group_ids='g1'"),
    ('{"group_ids": [""]}', "Assignment.payload.group_ids=['']"),
    ('{"final": "no"}', "Assignment.payload.final='no'"),
    ('{"run_id": 3}', "Assignment.payload.run_id=3"),
])
def test_a_malformed_assignment_payload_is_refused_naming_the_field(text: str, names: str) -> None:
    with pytest.raises(PayloadError) as info:
        AssignmentPayload.from_json(text)
    assert names in str(info.value)


def test_task_payload_is_the_dataset_row_in_canonical_json() -> None:
    row = {"task_id": "t1", "question": "2+2", "answer": 4, "tags": ["x"], "ü": "é"}
    text = TaskPayload(row).to_json()
    assert text == '{"answer":4,"question":"2+2","tags":["x"],"task_id":"t1","ü":"é"}'
    assert TaskPayload.from_json(text) == TaskPayload(row)


def test_task_payload_fields_are_read_typed() -> None:
    payload = TaskPayload.from_json('{"question": "2+2", "answer": 4, "ok": true}')
    assert payload.get("question", str) == "2+2"
    assert payload.get("answer", float) == 4.0 and isinstance(payload.get("answer", float), float)
    assert payload.get("ok", bool) is True
    with pytest.raises(PayloadError, match=r"TaskDispatched.payload: no field 'prompt' \(fields: \['answer'"):
        payload.get("prompt", str)
    with pytest.raises(PayloadError, match=r"TaskDispatched.payload.question='2\+2': a float is required"):
        payload.get("question", float)
    with pytest.raises(PayloadError, match=r"TaskDispatched.payload.ok=True: a int is required"):
        payload.get("ok", int)


@pytest.mark.parametrize("text", ["", "3", '"x"', "{"])
def test_a_task_payload_that_is_no_object_is_refused(text: str) -> None:
    with pytest.raises(PayloadError, match=r"TaskDispatched\.payload"):
        TaskPayload.from_json(text)


def test_a_task_row_that_is_not_json_is_refused_when_written() -> None:
    with pytest.raises(PayloadError, match=r"TaskDispatched\.payload: not JSON-serialisable"):
        TaskPayload({"when": object()}).to_json()
    with pytest.raises(PayloadError, match=r"TaskDispatched\.payload"):
        TaskPayload({"x": float("nan")}).to_json()
