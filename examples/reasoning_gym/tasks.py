"""The reasoning-gym example's tasks: rows of a reasoning-gym dataset, made by its own generator.

`make_tasks(count, seed, dataset=..., **dataset_options)` is the run config's task generator: it calls
`reasoning_gym.create_dataset(dataset, size=count, seed=seed, **dataset_options)` and writes each entry as a
row (`task_id`, `dataset`, `question`, `answer`, `metadata`). The entry's `source_index` is left out of the
row: it is the entry's position in one generated set, so two seeds' copies of one question would otherwise
differ, and the held-out evaluation (infra/evaluation.py) compares rows by content to keep every held-out
question out of training.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import reasoning_gym

DEFAULT_DATASET = "basic_arithmetic"
_POSITIONAL = ("source_index",)  # metadata that says where an entry sat, not what it is


@dataclass(frozen=True)
class GymTask:
    task_id: str
    dataset: str
    question: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def entry(self) -> dict[str, Any]:
        """The entry as reasoning-gym's `score_answer(answer, entry)` reads it."""
        return {"question": self.question, "answer": self.answer, "metadata": self.metadata}


def make_tasks(count: int, seed: int, dataset: str = DEFAULT_DATASET, **dataset_options: Any) -> list[GymTask]:
    """`count` entries of the reasoning-gym dataset `dataset` (its config's fields as `dataset_options`)."""
    entries = reasoning_gym.create_dataset(dataset, size=count, seed=seed, **dataset_options)
    return [_task(f"rg-{dataset}-{seed}-{i}", dataset, entry) for i, entry in enumerate(entries)]


def _task(task_id: str, dataset: str, entry: Mapping[str, Any]) -> GymTask:
    metadata = {k: v for k, v in entry.get("metadata", {}).items() if k not in _POSITIONAL}
    plain = json.loads(json.dumps(metadata, default=str))  # as the tasks file gives it back (tuples -> lists)
    return GymTask(task_id, dataset, str(entry["question"]), str(entry["answer"]), plain)


def task_from_row(row: Mapping[str, Any]) -> GymTask:
    """The task of a dispatched row (as `make_tasks` wrote it)."""
    return GymTask(str(row["task_id"]), str(row["dataset"]), str(row["question"]), str(row["answer"]),
                   dict(row.get("metadata") or {}))
