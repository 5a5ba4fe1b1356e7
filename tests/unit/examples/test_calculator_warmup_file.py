"""The calculator's demonstrations as the run config's callable gives them and as
`python -m examples.calculator.warmup` writes them: the same records, readable by the trainer's warm-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.calculator.tasks import make_arithmetic_tasks
from examples.calculator.tool import CALCULATOR_TOOL
from examples.calculator.warmup import WARMUP_SEED_OFFSET, demonstrations, main, warmup_conversations
from trainer_svc.warmup import demonstrations_from_records, read_demonstrations

pytestmark = pytest.mark.unit


def test_the_written_file_reads_back_as_the_callables_demonstrations(tmp_path: Path) -> None:
    records = demonstrations(64, seed=3, max_operand=9, direct_fraction=0.5)
    tasks = make_arithmetic_tasks(64, seed=WARMUP_SEED_OFFSET + 3, max_operand=9)
    assert [r["messages"] for r in records] == warmup_conversations(tasks, 0.5, seed=3)
    main(["--out", str(tmp_path / "demos.jsonl"), "--count", "64", "--seed", "3"])
    from_file = read_demonstrations(tmp_path / "demos.jsonl")
    assert from_file == demonstrations_from_records(records, "callable")
    assert from_file.tools == [CALCULATOR_TOOL] and len(from_file.conversations) == 64
