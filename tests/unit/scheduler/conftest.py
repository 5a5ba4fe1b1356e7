"""A scripted world around the scheduler core: it plays engines, agents and the trainer one
observation at a time, so tests can walk the state machine step by step or at random."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from scheduler_svc.decisions import (
    Assignment,
    Decision,
    LoadWeights,
    Observation,
    Preemption,
    ResourceDown,
    ResourceLost,
    ResourceRegistered,
    SampleCompleted,
    TaskAborted,
    TaskDispatched,
    Tick,
    TrainData,
    TrainStepCompleted,
    WeightsLoaded,
)
from scheduler_svc.policies import TagPolicy
from scheduler_svc.roofline import device_preset
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.settings import SchedulerSettings
from scheduler_svc.tags import TRAIN
from scheduler_svc.tasks import Task, TaskDataset


def make_tasks(count: int) -> TaskDataset:
    return TaskDataset(Task(f"t{i}", {"prompt": f"question {i}"}) for i in range(count))


class World:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.t = 0.0
        self.inflight: dict[str, set[int]] = {}  # group -> sample indices still rolling out
        self.dispatched_at: dict[str, int] = {}  # group -> version it was dispatched under
        self.reported: dict[str, Counter[int]] = {}  # group -> tokens per version, as reported
        self.aborted: list[TaskAborted] = []
        self.loads: dict[str, int] = {}  # resource -> version it was told to load
        self.train: Assignment | None = None
        self.train_final = False
        self.fed: list[TrainData] = []
        self.trained_groups: list[str] = []  # groups of completed steps, in order
        self.history: list[Decision] = []
        self.dead: set[str] = set()

    # ------------------------------------------------------------------ plumbing
    def observe(self, observation: Observation) -> list[Decision]:
        decisions = self.scheduler.handle(observation)
        for d in decisions:
            self._track(d)
        self.history.extend(decisions)
        return decisions

    def _track(self, d: Decision) -> None:
        if isinstance(d, TaskDispatched):
            self.inflight[d.group_id] = set(range(d.n_samples))
            self.dispatched_at[d.group_id] = d.policy_version
            self.reported[d.group_id] = Counter()
        elif isinstance(d, TaskAborted):
            self.inflight.pop(d.group_id, None)  # the adapter cancels its sessions
            self.aborted.append(d)
        elif isinstance(d, LoadWeights):
            self.loads[d.resource_id] = d.version
        elif isinstance(d, Assignment) and d.task_kind == TRAIN:
            self.train, self.train_final, self.fed = d, False, []
        elif isinstance(d, TrainData):
            self.fed.append(d)
            self.train_final = self.train_final or d.final
        elif isinstance(d, Preemption) and self.train is not None and d.assignment_id == self.train.assignment_id:
            self.train, self.train_final, self.fed = None, False, []
        elif isinstance(d, ResourceLost):
            self.loads.pop(d.resource_id, None)

    def advance(self, dt: float = 1.0) -> None:
        self.t += dt

    # ------------------------------------------------------------------ actions
    def register(self, rid: str, kind: str = "H800", version: int | None = 0) -> list[Decision]:
        self.dead.discard(rid)
        return self.observe(ResourceRegistered(self.t, rid, device_preset(kind), version))

    def register_all(self, kinds: Sequence[str]) -> None:
        for i, kind in enumerate(kinds):
            self.register(f"r{i}", kind)

    def complete_sample(
        self,
        group_id: str,
        index: int | None = None,
        tokens: int = 10,
        versions: Sequence[tuple[int, int]] | None = None,
    ) -> list[Decision]:
        """`versions`: the sample's tokens per policy version (partial rollout); default: all at the
        dispatch version, reported explicitly."""
        remaining = self.inflight[group_id]
        idx = min(remaining) if index is None else index
        remaining.discard(idx)
        if not remaining:
            del self.inflight[group_id]
        if versions is None:
            versions = [(self.dispatched_at[group_id], tokens)]
        for v, n in versions:
            self.reported[group_id][v] += n
        tokens = sum(n for _, n in versions)
        return self.observe(SampleCompleted(self.t, group_id, idx, tokens, tuple(versions)))

    def partial_rollout_versions(self, group_id: str, rng: random.Random) -> list[tuple[int, int]]:
        """Token versions of a sample that started at some version >= its group's dispatch version
        (it may have waited in a queue across a sync) and spanned every sync since then."""
        first = rng.randint(self.dispatched_at[group_id], self.scheduler.version)
        return [(v, rng.randint(0, 20)) for v in range(first, self.scheduler.version + 1)]

    def complete_group(self, group_id: str) -> list[Decision]:
        out: list[Decision] = []
        while group_id in self.inflight:
            out.extend(self.complete_sample(group_id))
        return out

    def complete_random_sample(self, rng: random.Random) -> list[Decision]:
        if not self.inflight:
            return []
        gid = rng.choice(sorted(self.inflight))
        return self.complete_sample(
            gid, rng.choice(sorted(self.inflight[gid])), versions=self.partial_rollout_versions(gid, rng)
        )

    def finish_train(self) -> list[Decision]:
        a = self.train
        if a is None or not self.train_final:
            return []
        step = a.step or 0
        self.trained_groups.extend(g for d in self.fed for g in d.group_ids)
        self.train, self.train_final, self.fed = None, False, []
        return self.observe(TrainStepCompleted(self.t, a.assignment_id, step, step + 1))

    def ack_load(self, rid: str | None = None) -> list[Decision]:
        if not self.loads:
            return []
        rid = rid or sorted(self.loads)[0]
        version = self.loads.pop(rid)
        return self.observe(WeightsLoaded(self.t, rid, version))

    def ack_all_loads(self) -> list[Decision]:
        out: list[Decision] = []
        while self.loads:
            out.extend(self.ack_load())
        return out

    def kill(self, rid: str) -> list[Decision]:
        self.dead.add(rid)
        return self.observe(ResourceDown(self.t, rid, "test"))

    def tick(self) -> list[Decision]:
        return self.observe(Tick(self.t))


def build(
    policy: TagPolicy,
    *,
    batch: int = 2,
    samples: int = 2,
    inflight_per_resource: int = 4,
    tasks: int = 200,
    **settings: object,
) -> World:
    scheduler = Scheduler(
        policy,
        SchedulerSettings(
            train_batch_groups=batch,
            samples_per_task=samples,
            max_inflight_samples_per_resource=inflight_per_resource,
            **settings,  # type: ignore[arg-type]
        ),
        make_tasks(tasks),
    )
    return World(scheduler)


@pytest.fixture(scope="session")
def world_factory() -> object:
    """`world_factory(policy, batch=..., samples=..., ...)` -> World (session scoped: usable with hypothesis)."""
    return build
