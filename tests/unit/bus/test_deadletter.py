"""The DeadLetter builder: coordinates, correlation id, bytes only."""

from __future__ import annotations

import pytest

from bus.deadletter import dead_letter
from schemas.events import DeadLetter, decode_event, encode_event

pytestmark = pytest.mark.unit


def test_a_letter_names_its_source_and_round_trips() -> None:
    letter = dead_letter("sf.llm.calls", 2, 41, key=b"s1", value=b"\x00raw", reason="undecodable: x",
                         consumer_group="g", producer="proc-0")
    assert isinstance(letter, DeadLetter) and letter.correlation_id == "sf.llm.calls:2:41"
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == ("sf.llm.calls", 2, 41)
    assert (letter.key_bytes, letter.value, letter.producer) == (b"s1", b"\x00raw", "proc-0")
    assert decode_event(encode_event(letter)) == letter


def test_decoded_keys_and_values_are_not_kept() -> None:
    letter = dead_letter("t", 0, 1, key="text key", value={"decoded": True}, reason="r", consumer_group="g")
    assert letter.key_bytes is None and letter.value is None and letter.producer == ""
