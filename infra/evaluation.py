"""Held-out evaluation, the pure part: which tasks, when, and what a result says.

A run's training reward is noisy (sampled at temperature 1, on tasks the policy is trained on, across
weight versions); the number a user trusts is accuracy on tasks it never trained on, each result tagged
with the weight version that produced it. So:

- **The held-out set** is made by the example's own task generator with its own seed (`eval.seed`,
  refused equal to `tasks.seed`), and every task whose content (the row without its `task_id`: for the
  calculator the question and answer) or `task_id` is among the training tasks is left out, so no
  held-out question is ever dispatched for training. It is written to `runs/<run>/eval_tasks.jsonl`.
- **When**: at the start (step 0, before the first train step: the demo starts its rollout workers only
  once that evaluation is recorded), after every `eval.every_steps` train steps, and after the run's last
  step (`run.max_steps`); `eval_steps` lists them. A point whose step has passed while an earlier
  evaluation ran is folded into the next one (the end is never skipped).
- **How**: one session per task through the same agent and reward as training, greedy (temperature 0,
  so a version's result does not depend on a sampling seed), via the capture proxy like any agent.
- **Tagged with what the proxy returned**: every reply names the weight versions its tokens came from
  (`sflow.weight_versions`); a result lists them all, so one that spans a weight update says so
  (`EvalCompleted.pinned` is False) instead of being attributed to one version.
- **Never trained on**: every session's group id starts with `schemas.rollout_events.HELD_OUT_GROUP_PREFIX`;
  the scheduler never dispatched these groups (its train steps name only groups it dispatched) and the
  trainer's buffer refuses them (`trainer_svc.ledger`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.errors import InfraError
from schemas.events import EvalCompleted
from schemas.rollout_events import HELD_OUT_GROUP_PREFIX

Row = dict[str, Any]
_OVERSAMPLE = (2, 4, 8, 16, 64)  # generated tasks per wanted one, tried in turn until enough are new
#: uuid5 namespace of evaluation event ids (fixed forever: a repeated evaluation is a duplicate by id)
NAMESPACE = uuid.UUID("5d1b3e0a-6f47-4c8e-b2a9-93d0c4e7f1a2")


def content_key(row: Mapping[str, Any]) -> str:
    """What makes two tasks the same task, whatever their ids: the row without its `task_id`."""
    return json.dumps({k: v for k, v in row.items() if k != "task_id"}, sort_keys=True, default=str)


def held_out_rows(generate: Callable[[int, int], Sequence[Row]], count: int, seed: int,
                  train_rows: Iterable[Mapping[str, Any]]) -> list[Row]:
    """`count` tasks from `generate(n, seed)` that are not training tasks (by content or id), nor
    copies of each other; deterministic for a given generator, count, seed and training set."""
    train = list(train_rows)
    seen_ids = {str(r.get("task_id")) for r in train}
    seen_content = {content_key(r) for r in train}
    for factor in _OVERSAMPLE:
        fresh: list[Row] = []
        ids, contents = set(seen_ids), set(seen_content)
        for row in generate(count * factor, seed):
            key, task_id = content_key(row), str(row.get("task_id"))
            if key in contents or task_id in ids:
                continue
            ids.add(task_id)
            contents.add(key)
            fresh.append(dict(row))
            if len(fresh) == count:
                return fresh
    raise InfraError(f"eval.tasks={count}: the generator with eval.seed={seed} gave only {len(fresh)} tasks "
                     f"that are not training tasks (from {count * _OVERSAMPLE[-1]} generated); ask for fewer")


def disjoint(held_out: Iterable[Mapping[str, Any]], train_rows: Iterable[Mapping[str, Any]]) -> bool:
    """No held-out task is a training task, by id or by content."""
    train = list(train_rows)
    ids, contents = {str(r.get("task_id")) for r in train}, {content_key(r) for r in train}
    return not any(str(r.get("task_id")) in ids or content_key(r) in contents for r in held_out)


def eval_steps(every_steps: int, max_steps: int) -> tuple[int, ...]:
    """Train steps after which an evaluation is due: 0 (the start), every `every_steps`, and `max_steps`."""
    return tuple(sorted({0, *range(every_steps, max_steps + 1, every_steps), max_steps}))


def trigger_of(step: int, max_steps: int) -> str:
    return "start" if step == 0 else "end" if step >= max_steps else "every"


def group_id_of(run_id: str, step: int, task_id: str) -> str:
    """The held-out marker first: no service trains a group whose id starts with it."""
    return f"{HELD_OUT_GROUP_PREFIX}{run_id}/step-{step}/{task_id}"


class EvalSchedule:
    """Which evaluation is due, from the train steps completed so far (as the run monitor counts them:
    distinct steps that were not skipped) and the newest version every engine loaded."""

    def __init__(self, every_steps: int, max_steps: int) -> None:
        self.max_steps = max_steps
        self.pending = list(eval_steps(every_steps, max_steps))
        self.steps: dict[int, int] = {}  # completed step -> its new version
        self.synced_version = 0

    @property
    def completed(self) -> int:
        return len(self.steps)

    @property
    def wanted_version(self) -> int:
        """The version the newest completed step made (0 before the first)."""
        return max(self.steps.values(), default=0)

    def step_completed(self, step: int, new_version: int, skipped: bool) -> None:
        if not skipped:
            self.steps.setdefault(step, new_version)

    def weights_synced(self, version: int) -> None:
        self.synced_version = max(self.synced_version, version)

    def due(self) -> int | None:
        """The step of the evaluation to run now (None: none is due). Points already passed are folded
        into this one; the end point is kept until its own step is reached."""
        passed = [p for p in self.pending if p <= self.completed]
        return passed[-1] if passed else None

    def synced(self) -> bool:
        """The engines serve the newest completed step's weights (else an evaluation would measure an
        older version than its point; it may still run after a wait: its tags tell)."""
        return self.synced_version >= self.wanted_version

    def done(self, step: int) -> None:
        self.pending = [p for p in self.pending if p > step]

    @property
    def finished(self) -> bool:
        return not self.pending


@dataclass(frozen=True)
class TaskResult:
    """One held-out session: its score (accuracy's unit, in [0, 1]), training reward and the weight
    versions of its output tokens as the proxy returned them (empty: none generated)."""

    task_id: str
    score: float
    reward: float
    versions: tuple[int, ...]
    failed: bool = False


def eval_event(run_id: str, step: int, max_steps: int, results: Sequence[TaskResult], *, temperature: float,
               tasks_seed: int, duration_ms: float) -> EvalCompleted:
    """The evaluation's event; its id is derived from the run and the step, so a repeat is a duplicate."""
    n = max(1, len(results))
    versions = sorted({v for r in results for v in r.versions})
    return EvalCompleted(
        event_id=uuid.uuid5(NAMESPACE, f"{run_id}/{step}").hex, correlation_id=run_id, run_id=run_id,
        eval_id=f"{run_id}/eval-step-{step}", step=step,
        trigger=trigger_of(step, max_steps), num_tasks=len(results),
        accuracy=sum(r.score for r in results) / n, reward_mean=sum(r.reward for r in results) / n,
        versions=tuple(versions), task_ids=tuple(r.task_id for r in results),
        task_scores=tuple(float(r.score) for r in results),
        task_min_versions=tuple(min(r.versions, default=-1) for r in results),
        task_max_versions=tuple(max(r.versions, default=-1) for r in results),
        failed=sum(r.failed for r in results), temperature=temperature, tasks_seed=tasks_seed,
        duration_ms=duration_ms)


def versions_in_reply(body: Mapping[str, Any]) -> set[int]:
    """The weight versions a proxy reply says its tokens came from (`sflow.weight_versions`, one list per
    choice); an engine's unknown version (-1) is not a version."""
    per_choice = (body.get("sflow") or {}).get("weight_versions") or []
    return {int(v) for versions in per_choice for v in versions if int(v) >= 0}
