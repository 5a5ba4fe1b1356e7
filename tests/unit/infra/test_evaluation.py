"""Held-out evaluation, the pure parts: a held-out set that no training task is in, when evaluations are
due, and results tagged with the weight versions the proxy returned (infra/evaluation.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from examples.calculator.tasks import make_arithmetic_tasks
from infra.errors import InfraError
from infra.evaluation import (
    EvalSchedule,
    TaskResult,
    content_key,
    disjoint,
    eval_event,
    eval_steps,
    group_id_of,
    held_out_rows,
    versions_in_reply,
)
from infra.monitor import RunState
from infra.run_inputs import RunPaths, task_rows, write_eval_tasks, write_tasks
from schemas.rollout_events import is_held_out
from tests.unit.infra.run_configs import DEMO, load

pytestmark = pytest.mark.unit


def calculator(n: int, seed: int) -> list[dict[str, object]]:
    return task_rows(make_arithmetic_tasks(n, seed, max_operand=9), "calculator")


def test_held_out_tasks_leave_out_every_training_question_and_are_deterministic() -> None:
    train = calculator(400, 7)
    raw = calculator(32, 1007)
    assert not disjoint(raw, train)  # single-digit problems repeat: a plain second seed would overlap
    held_out = held_out_rows(calculator, 32, 1007, train)
    assert len(held_out) == 32 and disjoint(held_out, train)
    questions = {r["question"] for r in held_out}
    assert len(questions) == 32 and not questions & {r["question"] for r in train}
    assert held_out == held_out_rows(calculator, 32, 1007, train)


def test_a_held_out_set_the_generator_cannot_fill_is_refused_with_the_field() -> None:
    train = calculator(400, 7)
    with pytest.raises(InfraError, match=r"eval\.tasks=5000"):
        held_out_rows(lambda n, seed: train, 5000, 1007, train)


def test_content_ignores_the_task_id() -> None:
    row = {"task_id": "a", "question": "What is 1 + 2?", "answer": 3.0}
    assert content_key(row) == content_key({**row, "task_id": "b"})
    assert not disjoint([{**row, "task_id": "b"}], [row])


def test_eval_points_are_the_start_every_n_steps_and_the_end() -> None:
    assert eval_steps(10, 40) == (0, 10, 20, 30, 40)
    assert eval_steps(15, 40) == (0, 15, 30, 40)
    assert eval_steps(50, 40) == (0, 40)


def test_the_schedule_waits_for_the_weights_and_folds_passed_points_but_keeps_the_end() -> None:
    s = EvalSchedule(every_steps=2, max_steps=5)
    assert s.due() == 0 and s.synced()  # the start: version 0 is what the engines begin with
    s.done(0)
    s.step_completed(1, 1, skipped=False)
    s.step_completed(2, 2, skipped=True)  # a skipped step is no step (the run monitor counts alike)
    assert s.due() is None
    s.step_completed(2, 2, skipped=False)
    assert s.due() == 2 and not s.synced()
    s.weights_synced(2)
    assert s.synced()
    for step in (3, 4, 5):  # while the evaluation of step 2 ran, steps 4 and 5 passed
        s.step_completed(step, step, skipped=False)
    s.done(2)
    assert s.due() == 5  # step 4 is folded into the end, which is never skipped
    s.done(5)
    assert s.finished and s.due() is None


def test_results_are_tagged_with_every_version_their_tokens_came_from() -> None:
    results = [TaskResult("t1", 1.0, 1.0, (3,)), TaskResult("t2", 0.0, 0.2, (3, 4)),
               TaskResult("t3", 0.0, 0.0, (), failed=True)]
    e = eval_event("run", 6, 10, results, temperature=0.0, tasks_seed=1007, duration_ms=12.0)
    assert (e.trigger, e.num_tasks, e.accuracy, e.failed) == ("every", 3, pytest.approx(1 / 3), 1)
    assert e.reward_mean == pytest.approx(0.4)
    assert e.versions == (3, 4) and not e.pinned
    assert (e.task_min_versions, e.task_max_versions) == ((3, 3, -1), (3, 4, -1))
    assert e.event_id == eval_event("run", 6, 10, results[:1], temperature=0.0, tasks_seed=1007,
                                    duration_ms=1.0).event_id  # a repeat of an evaluation is a duplicate
    start = eval_event("run", 0, 10, results[:1], temperature=0.0, tasks_seed=1007, duration_ms=1.0)
    assert (start.trigger, start.versions, start.pinned) == ("start", (3,), True)


def test_versions_are_read_from_the_proxy_reply_unknown_ones_left_out() -> None:
    assert versions_in_reply({"sflow": {"weight_versions": [[2, 3], [3]]}}) == {2, 3}
    assert versions_in_reply({"sflow": {"weight_versions": [[-1]]}}) == set()
    assert versions_in_reply({"object": "chat.completion"}) == set()


def test_held_out_groups_carry_the_marker_no_service_trains() -> None:
    assert is_held_out(group_id_of("demo", 10, "arith-1007-3"))
    assert not is_held_out("arith-7-3-g0")


def test_the_run_writes_a_held_out_tasks_file_disjoint_from_its_tasks_file(tmp_path: Path) -> None:
    config = load(tmp_path, eval={"enabled": True, "tasks": 16, "seed": 11})
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir()
    write_tasks(config, paths)
    rows = write_eval_tasks(config, paths)
    assert len(paths.eval_tasks.read_text().splitlines()) == 16
    assert disjoint(rows, [json.loads(line) for line in paths.tasks.read_text().splitlines()])


def test_the_eval_section_is_validated_at_load(tmp_path: Path) -> None:
    with pytest.raises(InfraError, match=r"eval\.seed=7 equals tasks\.seed"):
        load(tmp_path, eval={"enabled": True, "seed": 7}, tasks={"seed": 7})
    with pytest.raises(InfraError, match="every_steps"):
        load(tmp_path, eval={"every_steps": 0})
    assert not load(tmp_path).eval.enabled  # off unless a config turns it on
    demo = load(tmp_path, **yaml.safe_load(DEMO.read_text()))
    assert demo.eval.seed != demo.tasks.seed


def test_the_summary_shows_accuracy_at_the_start_and_the_end_with_their_versions() -> None:
    state = RunState()
    assert state.eval_start_end() == "no evaluation"
    results = [TaskResult("t1", 1.0, 1.0, (0,)), TaskResult("t2", 0.0, 0.0, (0,))]
    state.apply(eval_event("run", 0, 4, results, temperature=0.0, tasks_seed=1, duration_ms=1.0))
    later = [TaskResult("t1", 1.0, 1.0, (3, 4)), TaskResult("t2", 1.0, 1.0, (4,))]
    state.apply(eval_event("run", 4, 4, later, temperature=0.0, tasks_seed=1, duration_ms=1.0))
    from schemas import events as ev
    from tests.factories import example

    state.apply(example(ev.LLMCall, 0, group_id=group_id_of("run", 4, "t1"), output_versions=(3, 4)))
    state.apply(example(ev.LLMCall, 1, group_id="train-g", output_versions=(4, 4)))
    assert state.eval_start_end() == "0.500 (start, v0) -> 1.000 (end, v3-v4); 2 evaluations, 1 calls"
    assert (state.calls, state.calls_spanning_update) == (1, 0)  # a held-out call is no training rollout
    assert [e["accuracy"] for e in state.eval_summary()] == [0.5, 1.0]


def test_the_demo_starts_the_evaluator_before_the_rollout_workers_with_the_run_schedule(tmp_path: Path) -> None:
    from bus.config import BusConfig
    from infra.demo import service_specs
    from infra.evaluator import parser

    config = load(tmp_path, eval={"enabled": True, "every_steps": 5}, run={"max_steps": 12})
    for run in ("run", "r2"):
        (tmp_path / run).mkdir()
    specs = service_specs(config, RunPaths(tmp_path / "run"), BusConfig("127.0.0.1:1"), "-key", "admin")
    names = [s.name for s in specs]
    assert names.index("adapter") < names.index("evaluator") == names.index("rollout-workers") - 1
    args = list(specs[names.index("evaluator")].args)
    assert "evaluator" not in [s.name for s in service_specs(load(tmp_path), RunPaths(tmp_path / "r2"),
                                                              BusConfig("127.0.0.1:1"), "k", "a")]
    parsed = parser().parse_args(args)  # the flags it is given are the flags it takes
    assert (parsed.api_key, parsed.every_steps, parsed.max_steps) == ("-key", 5, 12)
    assert (parsed.tasks_file, parsed.tasks_seed) == (str(tmp_path / "run" / "eval_tasks.jsonl"), config.eval.seed)
    assert parsed.score == "examples.calculator.reward:correct" and parsed.task == config.example.task


def test_a_restarted_evaluator_takes_its_recorded_results_as_done() -> None:
    from infra.evaluator import follow
    from schemas import events as ev
    from tests.factories import example

    schedule = EvalSchedule(every_steps=2, max_steps=4)
    for step in (1, 2):
        follow(schedule, example(ev.TrainStepCompleted, step, run_id="run", step=step, new_version=step,
                                 status="completed"), "run")
    follow(schedule, example(ev.WeightSyncCompleted, 0, version=2), "run")
    follow(schedule, example(ev.TrainStepCompleted, 3, run_id="other", step=3, new_version=3,
                             status="completed"), "run")  # another run's step is no step of this one
    assert (schedule.completed, schedule.due(), schedule.synced()) == (2, 2, True)
    follow(schedule, eval_event("run", 0, 4, [], temperature=0.0, tasks_seed=1, duration_ms=0.0), "run")
    follow(schedule, eval_event("run", 2, 4, [], temperature=0.0, tasks_seed=1, duration_ms=0.0), "run")
    assert schedule.due() is None and schedule.pending == [4]
