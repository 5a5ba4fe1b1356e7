"""The calculator example's tasks: seeded two- and three-operand problems with integer answers.

`make_arithmetic_tasks` is what a run config names as its task generator (each task becomes one row of
the run's tasks file, the scheduler dispatches the row as the task's payload) and `task_from_row` turns
a dispatched row back into the task the agent and the reward take.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from examples.calculator.tool import evaluate


@dataclass(frozen=True)
class ArithmeticTask:
    task_id: str
    question: str
    answer: float


def make_arithmetic_tasks(n: int, seed: int = 0, max_operand: int = 99) -> list[ArithmeticTask]:
    """Two- and three-operand problems with integer answers."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        numbers = [rng.randint(1, max_operand) for _ in range(rng.choice((2, 3)))]
        ops = [rng.choice("+-*") for _ in numbers[1:]]
        expression = str(numbers[0]) + "".join(f" {op} {num}" for op, num in zip(ops, numbers[1:], strict=True))
        tasks.append(ArithmeticTask(f"arith-{seed}-{i}", f"What is {expression}?", evaluate(expression)))
    return tasks


def task_from_row(row: Mapping[str, Any]) -> ArithmeticTask:
    """The task of a tasks-file row (`task_id`, `question`, `answer`), as dispatched to the workers."""
    return ArithmeticTask(str(row["task_id"]), str(row["question"]), float(row["answer"]))


def expression_of(task: ArithmeticTask) -> str:
    return task.question.removeprefix("What is ").removesuffix("?")
