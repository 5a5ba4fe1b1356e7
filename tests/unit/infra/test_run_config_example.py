"""The run config's `example` section: its parts are named by module path and checked at start-up
(errors name the field and the value), and the demo's config names the calculator example."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from examples.calculator.agent import CalculatorAgent
from examples.calculator.tasks import make_arithmetic_tasks, task_from_row
from infra.errors import InfraError
from infra.example import CALCULATOR, load_reference
from infra.rollout_workers import Example, WorkerConfig
from infra.run_config import RunConfig
from infra.run_inputs import RunPaths, task_rows, write_tasks
from tests.unit.infra.run_configs import BASE, DEMO, load

pytestmark = pytest.mark.unit


def calculator(**changes: Any) -> dict[str, Any]:
    return {**CALCULATOR.model_dump(exclude_none=True), **changes}


def test_the_demo_names_the_calculator_example_and_writes_its_tasks(tmp_path: Path) -> None:
    config = RunConfig.load(DEMO)
    assert config.example == CALCULATOR == RunConfig.model_validate(BASE).example
    write_tasks(config, RunPaths(tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    expected = make_arithmetic_tasks(config.tasks.count, seed=config.tasks.seed, max_operand=9)
    assert rows == [dataclasses.asdict(t) for t in expected]
    assert [task_from_row(r) for r in rows] == expected


@pytest.mark.parametrize(("field", "value", "message"), [
    ("agent", "examples.calculator.agent:Nope", "has no attribute 'Nope'"),
    ("agent", "examples.nowhere:CalculatorAgent", "cannot import 'examples.nowhere'"),
    ("reward", "examples.calculator.reward", "not of the form package.module:attribute"),
    ("reward", "examples.calculator.reward:FORMAT_REWARD", "not a callable"),
    ("reward", "examples.calculator.tasks:task_from_row", "cannot be called as (_, _)"),
    ("tasks_options", {"max_operands": 9}, "max_operands"),
    ("warmup_options", {"direct_share": 0.5}, "direct_share"),
])
def test_a_bad_part_stops_the_run_at_start_up_naming_field_and_value(
        tmp_path: Path, field: str, value: Any, message: str) -> None:
    with pytest.raises(InfraError, match="invalid run config") as raised:
        load(tmp_path, example=calculator(**{field: value}))
    text = str(raised.value)
    assert field in text and str(value if isinstance(value, str) else next(iter(value))) in text
    assert message in text


def test_tasks_come_from_one_source_and_a_warmup_needs_data(tmp_path: Path) -> None:
    rows = [{"task_id": "t0", "question": "What is 1 + 1?", "answer": 2.0}]
    tasks_file = tmp_path / "mine.jsonl"
    tasks_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mine = calculator(tasks_file=str(tasks_file))
    with pytest.raises(InfraError, match="give one of tasks="):
        load(tmp_path, example=mine)
    del mine["tasks"], mine["tasks_options"]
    config = load(tmp_path, example=mine)
    write_tasks(config, RunPaths(tmp_path))
    assert (tmp_path / "tasks.jsonl").read_text() == tasks_file.read_text()
    with pytest.raises(InfraError, match=r"tasks_file='nowhere\.jsonl' is not a file"):
        load(tmp_path, example={**mine, "tasks_file": "nowhere.jsonl"})
    no_warmup = {k: v for k, v in mine.items() if k not in ("warmup", "warmup_options")}
    with pytest.raises(InfraError, match=r"model\.warmup_steps=1200 needs example\.warmup"):
        load(tmp_path, example=no_warmup)
    assert load(tmp_path, example=no_warmup, model={"warmup_steps": 0}).example.warmup is None


def test_task_rows_take_mappings_and_dataclasses_only() -> None:
    task = make_arithmetic_tasks(1)[0]
    assert task_rows([task, {"task_id": "x"}], "src") == [dataclasses.asdict(task), {"task_id": "x"}]
    with pytest.raises(InfraError, match="src: task 0 is a str"):
        task_rows(["What is 1 + 1?"], "src")


def test_rollout_workers_build_the_named_agent_with_their_settings() -> None:
    config = WorkerConfig("http://127.0.0.1:1/v1", "key", "m", max_turns=2, max_tokens=16, temperature=0.5)
    example = Example.load(config)
    assert isinstance(example.agent, CalculatorAgent)
    assert (example.agent.model, example.agent.max_turns, example.agent.max_tokens) == ("m", 2, 16)
    assert example.task_of is load_reference(CALCULATOR.task or "")
    assert Example.load(dataclasses.replace(config, task=None)).task_of({"a": 1}) == {"a": 1}
    with pytest.raises(InfraError, match=r"agent='examples\.calculator\.reward:shaped_reward' cannot be called"):
        Example.load(dataclasses.replace(config, agent="examples.calculator.reward:shaped_reward"))
