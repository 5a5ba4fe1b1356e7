"""The warm-up's data: demonstration records (`messages`, `tools`) from a JSON Lines file or a callable,
checked before any training (errors name the source and the record)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_svc.errors import TrainerError
from trainer_svc.warmup import Demonstrations, demonstrations_from_records, read_demonstrations

pytestmark = pytest.mark.unit
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_a_file_of_records_reads_as_conversations_and_their_tools(tmp_path: Path) -> None:
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps({"messages": CHAT, "tools": [TOOL]}) + "\n\n" + json.dumps({"messages": CHAT,
                                                                                             "tools": [TOOL]}) + "\n")
    assert read_demonstrations(path) == Demonstrations([CHAT, CHAT], [TOOL])
    assert demonstrations_from_records([{"messages": CHAT}], "src") == Demonstrations([CHAT], None)


@pytest.mark.parametrize(("records", "message"), [
    ([], "src: no demonstrations"),
    ([{"messages": []}], "src, record 0: expected"),
    ([{"messages": CHAT}, ["not", "a", "record"]], "src, record 1: expected"),
    ([{"messages": [{"content": "no role"}]}], "src, record 0: expected"),
    ([{"messages": CHAT, "tools": [TOOL]}, {"messages": CHAT}], "record 1: its tools differ from record 0's"),
])
def test_bad_records_are_refused_naming_the_record(records: list[object], message: str) -> None:
    with pytest.raises(TrainerError, match=message):
        demonstrations_from_records(records, "src")


def test_an_unreadable_or_malformed_file_names_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(TrainerError, match="cannot be read"):
        read_demonstrations(tmp_path / "missing.jsonl")
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n{not json\n")
    with pytest.raises(TrainerError, match="line 2 is not JSON"):
        read_demonstrations(path)
