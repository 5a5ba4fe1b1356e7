"""Rebuilding the scheduler from its journal, without Kafka: a fresh scheduler for a config, the
journal records replayed into it, and recorded states compared with the rebuilt ones.

The shell (`scheduler_svc.service`) reads the records from the `scheduler` topic and hands them here;
tests and `sflow replay scheduler` use the same code, so what they check is what a restart does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduler_svc.config import SchedulerServiceConfig
from scheduler_svc.errors import ReplayError
from scheduler_svc.journal import JournaledScheduler, Step
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.tasks import Task, TaskDataset
from schemas import events as ev

if TYPE_CHECKING:  # the records as the shell read them; nothing here touches Kafka
    from bus.consumer import Received


def load_tasks(config: SchedulerServiceConfig) -> TaskDataset:
    return TaskDataset.from_path(config.dataset, id_field=config.dataset_id_field)


def new_scheduler(config: SchedulerServiceConfig, tasks: Sequence[Task] | None = None) -> JournaledScheduler:
    core = Scheduler(config.tag_policy(), config.settings(), load_tasks(config) if tasks is None else tasks,
                     record_log=False)
    return JournaledScheduler(
        core,
        run_id=config.run_id,
        producer=config.instance_id,
        model=config.model,
        initial_weights_uri=config.initial_weights_uri,
        coalesce_s=config.coalesce_s,
        decision_config=config.decision_config(),
    )


@dataclass(frozen=True)
class CheckpointCheck:
    """A recorded state compared with the state rebuilt at the same journal position."""

    offset: int
    ts_ms: int
    observed_seq: int
    matches: bool
    differences: tuple[str, ...] = ()


@dataclass
class Rebuilt:
    scheduler: JournaledScheduler
    tail: list[tuple[Received, Step]] = field(default_factory=list)  # records after the last checkpoint
    last_checkpoint: ev.SchedulerCheckpoint | None = None
    checks: list[CheckpointCheck] = field(default_factory=list)
    records: int = 0


def rebuild(
    config: SchedulerServiceConfig,
    entries: Iterable[Received],
    tasks: Sequence[Task] | None = None,
    verify: Callable[[Received], bool] = lambda r: False,
) -> Rebuilt:
    """Replays journal entries into a fresh scheduler; checkpoints with a state for which `verify`
    holds are compared with the rebuilt state. Raises `ReplayError` when the journal was recorded
    with other decision settings or does not replay to what it recorded."""
    out = Rebuilt(new_scheduler(config, tasks))
    js = out.scheduler
    for r in entries:
        e = r.event
        if isinstance(e, ev.SchedulerObserved):
            # the single writer publishes each record once (idempotent producer, never re-published):
            # a gap or a second record with a seq means two instances wrote this run's journal
            out.tail.append((r, js.replay(e)))
            out.records += 1
        elif isinstance(e, ev.SchedulerCheckpoint):
            differences = config.decision_differences(json.loads(e.config))
            if differences:
                raise ReplayError(
                    f"run {config.run_id!r} was recorded with other decision settings ("
                    + "; ".join(differences) + "); use those, or start a new run_id"
                )
            if e.observed_seq != js.observed_seq or e.event_seq != js.event_seq:
                raise ReplayError(
                    f"checkpoint at offset {r.offset} follows {e.observed_seq} records / {e.event_seq} events, "
                    f"the journal has {js.observed_seq} / {js.event_seq}: records are missing"
                )
            out.tail.clear()
            out.last_checkpoint = e
            if e.state and verify(r):
                out.checks.append(compare_state(r, e, js.state()))
    return out


def compare_state(r: Received, checkpoint: ev.SchedulerCheckpoint, state: dict[str, Any]) -> CheckpointCheck:
    recorded = json.loads(checkpoint.state)
    differences = tuple(diff_states(recorded, state))
    return CheckpointCheck(r.offset, r.timestamp_ms, checkpoint.observed_seq, not differences, differences)


def diff_states(recorded: Any, rebuilt: Any, path: str = "", limit: int = 50) -> list[str]:
    """'path: recorded X, rebuilt Y' for every leaf that differs (at most `limit`)."""
    out: list[str] = []

    def walk(a: Any, b: Any, where: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{where}.{k}" if where else str(k))
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{where}[{i}]")
        elif a != b:
            out.append(f"{where or '<root>'}: recorded {json.dumps(a)[:120]}, rebuilt {json.dumps(b)[:120]}")

    walk(recorded, rebuilt, path)
    return out
