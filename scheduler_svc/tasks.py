"""The task dataset: an ordered, id-unique list of tasks read from JSONL or Parquet.

Its order is what the loader's cursor counts in, so a dataset must read back the same on every
start (a restart re-derives which tasks were dispatched from positions, not from ids).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from scheduler_svc.errors import LoaderError


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str
    payload: Mapping[str, Any]


class TaskDataset(Sequence[Task]):
    """An ordered, id-unique list of tasks (JSONL or Parquet rows, or in-memory records)."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        self._tasks = list(tasks)
        seen: set[str] = set()
        for task in self._tasks:
            if task.task_id in seen:
                raise LoaderError(f"duplicate task id {task.task_id!r} in dataset")
            seen.add(task.task_id)

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], *, id_field: str = "task_id") -> TaskDataset:
        """Rows without `id_field` get the id `row-<index>` (stable as long as the file is)."""
        tasks = []
        for index, row in enumerate(records):
            if not isinstance(row, Mapping):
                raise LoaderError(f"row {index} is a {type(row).__name__}, expected an object")
            raw_id = row.get(id_field, f"row-{index}")
            tasks.append(Task(str(raw_id), dict(row)))
        return cls(tasks)

    @classmethod
    def from_jsonl(cls, path: str | Path, *, id_field: str = "task_id") -> TaskDataset:
        rows: list[Mapping[str, Any]] = []
        try:
            with open(path, encoding="utf-8") as f:
                for line_no, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise LoaderError(f"{path}:{line_no}: not JSON ({e.msg})") from e
        except OSError as e:
            raise LoaderError(f"cannot read task dataset {path}: {e}") from e
        return cls.from_records(rows, id_field=id_field)

    @classmethod
    def from_parquet(cls, path: str | Path, *, id_field: str = "task_id") -> TaskDataset:
        try:
            import pyarrow.parquet as pq
        except ImportError as e:  # optional dependency
            raise LoaderError("reading Parquet task datasets needs pyarrow") from e
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as e:
            raise LoaderError(f"cannot read task dataset {path}: {e}") from e
        return cls.from_records(table.to_pylist(), id_field=id_field)

    @classmethod
    def from_path(cls, path: str | Path, *, id_field: str = "task_id") -> TaskDataset:
        suffix = Path(path).suffix.lower()
        if suffix in (".jsonl", ".json", ".ndjson"):
            return cls.from_jsonl(path, id_field=id_field)
        if suffix in (".parquet", ".pq"):
            return cls.from_parquet(path, id_field=id_field)
        raise LoaderError(f"task dataset {path}: unknown format {suffix!r} (use .jsonl or .parquet)")

    def __len__(self) -> int:
        return len(self._tasks)

    @overload
    def __getitem__(self, index: int) -> Task: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Task]: ...
    def __getitem__(self, index: int | slice) -> Task | Sequence[Task]:
        return self._tasks[index]

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks)
