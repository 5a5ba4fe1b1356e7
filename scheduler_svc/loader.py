"""Streaming data loader core: the task dataset and the ledger of every dispatched GRPO group.

Tasks are handed out one group at a time whenever the scheduler grants capacity (never in fixed
batches). The ledger follows each group through dispatched -> completed -> fed to a train step ->
consumed (or -> aborted, then re-dispatched or dropped), so the rollout manager can pick train
batches and enforce the staleness bound.

Versions are per token. Each completed sample reports how many of its tokens each policy version
generated (partial rollout: a sample that spans a weight sync has tokens at several versions); the
group's *floor version* is the oldest of them, and it is the floor, not the dispatch version, that
the staleness bound constrains. Until a group completes its floor is taken to be its dispatch
version, a lower bound (no token can be older than the group).

Restart safety: the cursor and the ledger are rebuilt by applying the recorded TaskDispatched /
SampleCompleted / TaskCompleted / TrainData / Preemption / TrainStepCompleted records, so a task is
never dispatched twice and an in-flight task is never forgotten. Duplicate sample reports (Kafka
delivers at least once) are ignored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler_svc.decisions import (
    OBSERVATION_TYPES,
    Preemption,
    Record,
    SampleCompleted,
    TaskAborted,
    TaskCompleted,
    TaskDispatched,
    TrainData,
    TrainStepCompleted,
    TrainStepSkipped,
)
from scheduler_svc.errors import ConfigError, ReplayError
from scheduler_svc.tags import TRAIN
from scheduler_svc.tasks import Task


@dataclass
class GroupState:
    group_id: str
    task_id: str
    position: int
    n_samples: int
    policy_version: int
    attempt: int = 0
    done: set[int] = field(default_factory=set)
    tokens: int = 0
    completed: bool = False
    assignment_id: str | None = None
    #: generated tokens per policy version, over the completed samples
    token_versions: Counter[int] = field(default_factory=Counter)
    #: oldest version among the tokens of the completed samples (None: no sample reported yet)
    oldest_reported: int | None = None
    #: time of the observation whose handling dispatched it (the group timeout counts from there)
    dispatched_at: float = 0.0

    @property
    def floor_version(self) -> int:
        """Oldest policy version among the group's tokens; the dispatch version while it is rolling
        out (a lower bound), the true oldest token version once it is complete."""
        if not self.completed or self.oldest_reported is None:
            return self.policy_version
        return self.oldest_reported

    def snapshot(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "position": self.position,
            "n_samples": self.n_samples,
            "policy_version": self.policy_version,
            "attempt": self.attempt,
            "done": tuple(sorted(self.done)),
            "tokens": self.tokens,
            "completed": self.completed,
            "assignment_id": self.assignment_id,
            "token_versions": dict(sorted(self.token_versions.items())),
            "oldest_reported": self.oldest_reported,
            "dispatched_at": self.dispatched_at,
        }


def group_id_of(task_id: str, epoch: int, attempt: int) -> str:
    """`task@epoch` for a first dispatch, `task@epoch#rK` for its K-th re-generation."""
    return f"{task_id}@{epoch}" if attempt == 0 else f"{task_id}@{epoch}#r{attempt}"


class StreamingDataLoader:
    def __init__(self, tasks: Sequence[Task], *, samples_per_task: int, epochs: int = 1) -> None:
        if samples_per_task < 1:
            raise ConfigError(f"samples_per_task must be >= 1, got {samples_per_task!r}")
        if epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {epochs!r}")
        self.tasks = tasks
        self.samples_per_task = samples_per_task
        self.epochs = epochs
        self.cursor = 0
        self.groups: dict[str, GroupState] = {}  # live groups: dispatched and not yet consumed
        self.consumed: set[str] = set()
        self.aborted: set[str] = set()
        #: (position, attempt) of aborted tasks waiting to be dispatched again, oldest first
        self.regenerate: list[tuple[int, int]] = []
        self.dropped_total = 0
        self.ready: dict[str, GroupState] = {}  # completed, not fed to a train step
        self.inflight_unassigned: Counter[int] = Counter()  # dispatch version -> groups still rolling out
        self.ready_by_version: Counter[int] = Counter()  # floor version -> groups in `ready`
        self.inflight_unassigned_total = 0
        self.by_assignment: dict[str, list[str]] = {}
        self.inflight_samples = 0
        self.unassigned_outstanding = 0  # dispatched groups not yet fed to a train step
        self.completed_total = 0
        self.ignored_samples = 0
        self.now = 0.0  # latest observation time (decisions carry none)

    # ---------------------------------------------------------------------------------- queries

    @property
    def total_positions(self) -> int:
        return len(self.tasks) * self.epochs

    def remaining(self) -> int:
        return self.total_positions - self.cursor + len(self.regenerate)

    def exhausted(self) -> bool:
        return self.cursor >= self.total_positions and not self.regenerate

    def inflight_unassigned_at_or_below(self, version: int) -> int:
        if version < 0:
            return 0
        return sum(n for v, n in self.inflight_unassigned.items() if v <= version)

    def ready_at_or_below(self, version: int) -> int:
        if version < 0:
            return 0
        return sum(n for v, n in self.ready_by_version.items() if v <= version)

    def ready_sorted(self) -> list[GroupState]:
        """Completed groups not yet trained on, oldest token version first, then dispatch order."""
        return sorted(self.ready.values(), key=lambda g: (g.floor_version, g.position, g.attempt))

    def inflight_unassigned_groups_at_or_below(self, version: int) -> list[GroupState]:
        """Groups still rolling out, not fed to a step, dispatched at `version` or earlier."""
        if version < 0 or not self.inflight_unassigned_at_or_below(version):
            return []
        return [
            g
            for g in self.groups.values()
            if not g.completed and g.assignment_id is None and g.policy_version <= version
        ]

    def timed_out_groups(self, now: float, timeout_s: float | None) -> list[GroupState]:
        """Groups still rolling out, not fed to a step, dispatched `timeout_s` or longer before `now`."""
        if timeout_s is None or not self.inflight_unassigned_total:
            return []
        return [
            g
            for g in self.groups.values()
            if not g.completed and g.assignment_id is None and now - g.dispatched_at >= timeout_s
        ]

    # ---------------------------------------------------------------------------------- planners

    def plan_dispatch(self, n_groups: int, policy_version: int) -> list[TaskDispatched]:
        """Up to `n_groups` dispatches: aborted tasks to re-generate first (oldest first), then new ones."""
        n_groups = max(n_groups, 0)
        todo = self.regenerate[:n_groups]
        new_end = min(self.cursor + n_groups - len(todo), self.total_positions)
        todo = todo + [(position, 0) for position in range(self.cursor, new_end)]
        out = []
        for position, attempt in todo:
            task = self.tasks[position % len(self.tasks)]
            epoch = position // len(self.tasks)
            out.append(
                TaskDispatched(
                    task_id=task.task_id,
                    group_id=group_id_of(task.task_id, epoch, attempt),
                    n_samples=self.samples_per_task,
                    payload=task.payload,
                    policy_version=policy_version,
                    position=position,
                    attempt=attempt,
                )
            )
        return out

    def plan_abort(self, groups: Iterable[GroupState], cause: str, max_regenerations: int) -> list[TaskAborted]:
        """Abort groups that can no longer be trained within the staleness bound."""
        return [
            TaskAborted(
                task_id=g.task_id,
                group_id=g.group_id,
                n_samples=g.n_samples,
                policy_version=g.policy_version,
                cause=cause,
                regenerate=g.attempt < max_regenerations,
                attempt=g.attempt,
                n_tokens=g.tokens,
            )
            for g in sorted(groups, key=lambda g: (g.position, g.attempt))
        ]

    def plan_completion(self, group_id: str) -> list[TaskCompleted]:
        g = self.groups.get(group_id)
        if g is None or g.completed or len(g.done) < g.n_samples:
            return []
        return [TaskCompleted(g.task_id, g.group_id, g.n_samples, g.policy_version, g.tokens)]

    # ---------------------------------------------------------------------------------- evolve

    def apply(self, record: Record) -> None:
        if isinstance(record, OBSERVATION_TYPES):
            self.now = max(self.now, record.t)  # type: ignore[union-attr]
        handler = _APPLY.get(type(record))
        if handler is not None:
            handler(self, record)

    def _apply_dispatched(self, d: TaskDispatched) -> None:
        if d.group_id in self.groups or d.group_id in self.consumed or d.group_id in self.aborted:
            raise ReplayError(f"group {d.group_id!r} dispatched twice")
        if d.attempt == 0:
            if d.position != self.cursor:
                raise ReplayError(f"dispatch at position {d.position} but the loader cursor is {self.cursor}")
            self.cursor = d.position + 1
        else:
            try:
                self.regenerate.remove((d.position, d.attempt))
            except ValueError:
                raise ReplayError(
                    f"re-dispatch of position {d.position} (attempt {d.attempt}) that was not aborted"
                ) from None
        self.groups[d.group_id] = GroupState(
            d.group_id, d.task_id, d.position, d.n_samples, d.policy_version, attempt=d.attempt,
            dispatched_at=self.now,
        )
        self.inflight_samples += d.n_samples
        self._add_inflight(d.policy_version)
        self.unassigned_outstanding += 1

    def _apply_sample(self, obs: SampleCompleted) -> None:
        g = self.groups.get(obs.group_id)
        if g is None or g.completed or obs.sample_index in g.done or not 0 <= obs.sample_index < g.n_samples:
            self.ignored_samples += 1
            return
        g.done.add(obs.sample_index)
        g.tokens += obs.n_tokens
        self.inflight_samples -= 1
        versions = [(v, n) for v, n in obs.token_versions if n > 0]
        if not obs.token_versions and obs.n_tokens > 0:
            versions = [(g.policy_version, obs.n_tokens)]
        for v, n in versions:
            g.token_versions[v] += n
        if versions:  # a sample without tokens has none that could be stale
            oldest = min(v for v, _ in versions)
            g.oldest_reported = oldest if g.oldest_reported is None else min(g.oldest_reported, oldest)

    def _apply_completed(self, d: TaskCompleted) -> None:
        g = self.groups.get(d.group_id)
        if g is None or g.completed:
            raise ReplayError(f"completion of unknown or already completed group {d.group_id!r}")
        g.completed = True
        self.completed_total += 1
        # Samples never reported individually (a shell that only reports whole groups) leave flight too.
        unreported = g.n_samples - len(g.done)
        self.inflight_samples -= unreported
        if unreported:
            # their tokens are known only in total: count them at the dispatch version (the oldest possible)
            g.oldest_reported = (
                g.policy_version if g.oldest_reported is None else min(g.oldest_reported, g.policy_version)
            )
            if d.n_tokens > g.tokens:
                g.token_versions[g.policy_version] += d.n_tokens - g.tokens
                g.tokens = d.n_tokens
        g.done = set(range(g.n_samples))
        if g.assignment_id is None:
            self._drop_inflight(g.policy_version)
            self._add_ready(g)

    def _add_inflight(self, version: int) -> None:
        self.inflight_unassigned[version] += 1
        self.inflight_unassigned_total += 1

    def _drop_inflight(self, version: int) -> None:
        self.inflight_unassigned_total -= 1
        self.inflight_unassigned[version] -= 1
        if self.inflight_unassigned[version] <= 0:
            del self.inflight_unassigned[version]

    def _add_ready(self, g: GroupState) -> None:
        self.ready[g.group_id] = g
        self.ready_by_version[g.floor_version] += 1

    def _drop_ready(self, g: GroupState) -> None:
        del self.ready[g.group_id]
        self.ready_by_version[g.floor_version] -= 1
        if self.ready_by_version[g.floor_version] <= 0:
            del self.ready_by_version[g.floor_version]

    def _apply_train_data(self, d: TrainData) -> None:
        fed = self.by_assignment.setdefault(d.assignment_id, [])
        for gid in d.group_ids:
            g = self.groups.get(gid)
            if g is None or g.assignment_id is not None:
                raise ReplayError(f"group {gid!r} fed to {d.assignment_id!r} but it is not available")
            g.assignment_id = d.assignment_id
            self.unassigned_outstanding -= 1
            if g.completed:
                self._drop_ready(g)
            else:
                self._drop_inflight(g.policy_version)
            fed.append(gid)

    def _apply_preemption(self, d: Preemption) -> None:
        if d.task_kind == TRAIN:
            self._release(d.assignment_id)

    def _apply_step_skipped(self, obs: TrainStepSkipped) -> None:
        # handed back like a preempted step's; the scheduler then aborts them (cause "untrainable")
        self._release(obs.assignment_id)

    def _release(self, assignment_id: str) -> None:
        """The groups fed to a step that did not consume them wait for a step again."""
        for gid in self.by_assignment.pop(assignment_id, []):
            g = self.groups[gid]
            g.assignment_id = None
            self.unassigned_outstanding += 1
            if g.completed:
                self._add_ready(g)
            else:
                self._add_inflight(g.policy_version)

    def _apply_step_completed(self, obs: TrainStepCompleted) -> None:
        for gid in self.by_assignment.pop(obs.assignment_id, []):
            self.groups.pop(gid, None)
            self.consumed.add(gid)
        for gid in obs.added_group_ids:  # trained by dynamic sampling before any step was handed them
            g = self.groups.get(gid)
            if g is None or g.assignment_id is not None:
                continue
            if g.completed:
                self._drop_ready(g)
            else:
                self._drop_inflight(g.policy_version)
            self.unassigned_outstanding -= 1
            del self.groups[gid]
            self.consumed.add(gid)

    def _apply_aborted(self, d: TaskAborted) -> None:
        g = self.groups.get(d.group_id)
        if g is None or g.assignment_id is not None:
            raise ReplayError(f"abort of group {d.group_id!r}, which is not waiting for a train step")
        del self.groups[d.group_id]
        self.aborted.add(d.group_id)
        self.unassigned_outstanding -= 1
        if g.completed:
            self._drop_ready(g)
        else:
            self._drop_inflight(g.policy_version)
            self.inflight_samples -= g.n_samples - len(g.done)
        if d.regenerate:
            self.regenerate.append((g.position, g.attempt + 1))
        else:
            self.dropped_total += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "groups": {gid: g.snapshot() for gid, g in self.groups.items()},
            "consumed": tuple(sorted(self.consumed)),
            "aborted": tuple(sorted(self.aborted)),
            "regenerate": tuple(self.regenerate),
            "dropped_total": self.dropped_total,
            "ready": tuple(sorted(self.ready)),
            "inflight_unassigned": dict(sorted(self.inflight_unassigned.items())),
            "ready_by_version": dict(sorted(self.ready_by_version.items())),
            "inflight_unassigned_total": self.inflight_unassigned_total,
            "by_assignment": {aid: tuple(gids) for aid, gids in self.by_assignment.items()},
            "inflight_samples": self.inflight_samples,
            "unassigned_outstanding": self.unassigned_outstanding,
            "completed_total": self.completed_total,
            "ignored_samples": self.ignored_samples,
            "now": self.now,
        }


_APPLY: dict[type, Any] = {
    TaskDispatched: StreamingDataLoader._apply_dispatched,
    SampleCompleted: StreamingDataLoader._apply_sample,
    TaskCompleted: StreamingDataLoader._apply_completed,
    TrainData: StreamingDataLoader._apply_train_data,
    Preemption: StreamingDataLoader._apply_preemption,
    TrainStepCompleted: StreamingDataLoader._apply_step_completed,
    TrainStepSkipped: StreamingDataLoader._apply_step_skipped,
    TaskAborted: StreamingDataLoader._apply_aborted,
}
