"""Streaming data loader: dataset formats, streaming dispatch, and no loss or duplication of tasks
across a restart rebuilt from the recorded decisions."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_svc.decisions import SampleCompleted, TaskAborted, TaskCompleted, TaskDispatched
from scheduler_svc.errors import LoaderError, ReplayError
from scheduler_svc.loader import StreamingDataLoader
from scheduler_svc.policies import colocated, spatiotemporal
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.tasks import Task, TaskDataset

pytestmark = pytest.mark.unit


def test_jsonl_and_parquet_datasets(tmp_path: Path) -> None:
    rows = [{"task_id": "a", "prompt": "1+1"}, {"prompt": "2+2"}, {"task_id": 7, "prompt": "3+3"}]
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    ds = TaskDataset.from_path(jsonl)
    assert [t.task_id for t in ds] == ["a", "row-1", "7"]
    assert ds[1].payload["prompt"] == "2+2"
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(
        pa.Table.from_pylist([{"task_id": "x", "prompt": "p"}, {"task_id": "y", "prompt": "q"}]), tmp_path / "t.parquet"
    )
    assert [t.task_id for t in TaskDataset.from_path(tmp_path / "t.parquet")] == ["x", "y"]


def test_dataset_errors_name_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "a"}\nnot json\n')
    with pytest.raises(LoaderError, match=r"bad\.jsonl:2"):
        TaskDataset.from_jsonl(bad)
    with pytest.raises(LoaderError, match="duplicate task id 'a'"):
        TaskDataset([Task("a", {}), Task("a", {})])
    with pytest.raises(LoaderError, match="unknown format"):
        TaskDataset.from_path(tmp_path / "t.csv")
    with pytest.raises(LoaderError, match="cannot read"):
        TaskDataset.from_jsonl(tmp_path / "missing.jsonl")


def test_dispatch_is_streaming_and_bounded_by_capacity(world_factory) -> None:
    world = world_factory(spatiotemporal(1), batch=8, samples=2, inflight_per_resource=4)
    world.register("r0")
    assert len(world.inflight) == 2  # 4 slots / 2 samples: capacity, not the batch, limits dispatch
    gid = sorted(world.inflight)[0]
    world.complete_sample(gid)
    assert len(world.inflight) == 2  # one free slot is not enough for a 2-sample group
    decisions = world.complete_sample(gid)
    assert [type(d) for d in decisions] == [TaskCompleted, TaskDispatched]  # refilled at once


def test_duplicate_and_unknown_sample_reports_are_ignored() -> None:
    loader = StreamingDataLoader([Task("a", {})], samples_per_task=2)
    (d,) = loader.plan_dispatch(5, policy_version=0)
    loader.apply(d)
    loader.apply(SampleCompleted(1.0, "a@0", 0))
    loader.apply(SampleCompleted(1.0, "a@0", 0))
    loader.apply(SampleCompleted(1.0, "zzz@0", 0))
    loader.apply(SampleCompleted(1.0, "a@0", 9))
    assert loader.groups["a@0"].done == {0} and loader.ignored_samples == 3
    assert loader.plan_completion("a@0") == []
    loader.apply(SampleCompleted(2.0, "a@0", 1))
    assert [c.group_id for c in loader.plan_completion("a@0")] == ["a@0"]
    assert loader.exhausted()


def test_epochs_give_fresh_group_ids_and_replaying_a_dispatch_twice_fails() -> None:
    loader = StreamingDataLoader([Task("a", {}), Task("b", {})], samples_per_task=1, epochs=2)
    ds = loader.plan_dispatch(10, 0)
    assert [d.group_id for d in ds] == ["a@0", "b@0", "a@1", "b@1"]
    loader.apply(ds[0])
    with pytest.raises(ReplayError):
        loader.apply(ds[0])


def _run_until(scheduler_world, rng: random.Random, events: int) -> None:
    for _ in range(events):
        scheduler_world.advance(1.0)
        choice = rng.random()
        if choice < 0.7:
            scheduler_world.complete_random_sample(rng)
        elif choice < 0.85:
            scheduler_world.finish_train()
        else:
            scheduler_world.ack_load()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), crash_after=st.integers(0, 300), eta=st.integers(0, 2))
def test_no_task_is_lost_or_repeated_across_a_restart(world_factory, seed, crash_after, eta) -> None:
    """Run, crash (throw the scheduler away), rebuild it from the recorded log, and finish the
    dataset: every task is dispatched exactly once and completed exactly once."""
    policy = spatiotemporal(1, max_staleness=eta) if eta else colocated()
    world = world_factory(policy, batch=2, samples=2, inflight_per_resource=4, tasks=30)
    world.register_all(["H800", "H800", "H20"])
    rng = random.Random(seed)
    _run_until(world, rng, crash_after)
    old = world.scheduler
    rebuilt = Scheduler.from_log(old.policy, old.settings, old.loader.tasks, list(old.log))
    assert rebuilt.snapshot() == old.snapshot()
    world.scheduler = rebuilt  # the agents and engines keep running; only the scheduler restarted
    for _ in range(5000):
        if rebuilt.loader.exhausted() and not world.inflight and world.train is None:
            break
        world.advance(1.0)
        if not world.finish_train() and not world.ack_load():
            world.complete_random_sample(rng)
    world.finish_train()
    dispatched = [d.task_id for d in rebuilt.log if isinstance(d, TaskDispatched)]
    completed = [d.task_id for d in rebuilt.log if isinstance(d, TaskCompleted)]
    assert sorted(dispatched) == sorted(f"t{i}" for i in range(30))
    assert sorted(completed) == sorted(dispatched)
    assert rebuilt.loader.completed_total == 30


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), crash_after=st.integers(0, 300), regenerations=st.integers(0, 2))
def test_with_aborts_every_task_is_completed_once_or_dropped_across_a_restart(
    world_factory, seed, crash_after, regenerations
) -> None:
    """Abort mode: a straggler's task is re-generated (a new group id, attempt + 1) up to
    `max_regenerations` times, then dropped. Across a crash and rebuild, each task ends completed
    exactly once or dropped, never both, and is never dispatched more often than allowed."""
    from dataclasses import replace

    policy = replace(spatiotemporal(1, straggler="abort"), max_regenerations=regenerations)
    world = world_factory(policy, batch=2, samples=2, inflight_per_resource=4, tasks=30)
    world.register_all(["H800", "H800", "H20"])
    rng = random.Random(seed)
    _run_until(world, rng, crash_after)
    old = world.scheduler
    rebuilt = Scheduler.from_log(old.policy, old.settings, old.loader.tasks, list(old.log))
    assert rebuilt.snapshot() == old.snapshot()
    world.scheduler = rebuilt
    for _ in range(5000):
        if rebuilt.loader.exhausted() and not world.inflight and world.train is None:
            break
        world.advance(1.0)
        if not world.finish_train() and not world.ack_load():
            world.complete_random_sample(rng)
    world.finish_train()
    log = rebuilt.log
    completed = [d.task_id for d in log if isinstance(d, TaskCompleted)]
    dropped = [d.task_id for d in log if isinstance(d, TaskAborted) and not d.regenerate]
    attempts = [(d.task_id, d.attempt) for d in log if isinstance(d, TaskDispatched)]
    assert len(completed) == len(set(completed)) and not set(completed) & set(dropped)
    assert sorted(completed + dropped) == sorted(f"t{i}" for i in range(30))
    assert len(attempts) == len(set(attempts)) and max(a for _, a in attempts) <= regenerations
    assert rebuilt.loader.dropped_total == len(dropped)


def test_a_re_dispatch_of_a_task_that_was_never_aborted_is_rejected() -> None:
    loader = StreamingDataLoader([Task("a", {}), Task("b", {})], samples_per_task=1)
    first, _ = loader.plan_dispatch(2, 0)
    loader.apply(first)
    with pytest.raises(ReplayError, match="not aborted"):
        loader.apply(TaskDispatched("a", "a@0#r1", 1, {}, 0, position=0, attempt=1))
    (abort,) = loader.plan_abort([loader.groups["a@0"]], "staleness_bound", max_regenerations=1)
    loader.apply(abort)
    assert not loader.exhausted() and loader.remaining() == 2
    retry, fresh = loader.plan_dispatch(5, 1)
    assert (retry.group_id, retry.attempt, fresh.group_id) == ("a@0#r1", 1, "b@0")
    loader.apply(retry)
    with pytest.raises(ReplayError, match="dispatched twice"):
        loader.apply(TaskDispatched("a", "a@0", 1, {}, 0, position=0))
