"""A short job through every service on the real broker (the same code path as `make demo`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bus.replay import replay
from infra.demo import run
from infra.kafka.cluster import KafkaCluster
from infra.run_config import RunConfig
from schemas import events as ev

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(900)]

CONFIG = {
    "name": "e2e",
    "model": {"warmup_tasks": 32, "warmup_steps": 10},
    "tasks": {"count": 200},
    # Colocated: every resource rolls out and trains. When a batch is ready the groups dispatched
    # ahead of it (staleness 2) are still generating: the train step preempts them in place, and they
    # resume under the new weights, so calls span the weight update (partial rollout). Fixed-length
    # generations (ignore_eos) keep requests long enough to be caught.
    "inference": {"max_running_requests": 32, "resources": [
        {"id": "r0", "cpus": [0], "capabilities": ["rollout", "train"]},
        {"id": "r1", "cpus": [1], "capabilities": ["rollout", "train"]},
    ]},
    "scheduler": {"policy": "colocated", "train_resources": 1, "train_batch_groups": 2,
                  "samples_per_task": 4, "max_staleness": 2},
    "agent": {"concurrency": 16, "max_turns": 2, "max_tokens": 160, "ignore_eos": True},
    "run": {"max_steps": 4, "max_minutes": 8},
}


def test_short_job_through_every_service(kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    result = run(RunConfig.model_validate(CONFIG), runs_root=tmp_path, cluster=kafka_cluster)
    events = [r.event for r in replay(result.bus, ["llm.calls", "trajectories", "train", "weights"]).events]
    calls = {e.call_id: e for e in events if isinstance(e, ev.LLMCall)}
    trajectories = {e.trajectory_id: e for e in events if isinstance(e, ev.Trajectory)}
    steps = {e.step: e for e in events if isinstance(e, ev.TrainStepCompleted)}

    # Trajectories were trained on, and each at most once.
    trained = [t for s in steps.values() for t in s.trajectory_ids]
    assert len(steps) >= 4 and trained
    assert len(trained) == len(set(trained)) and set(trained) <= set(trajectories)

    # No call lost: served by the proxy = recorded on the bus = merged into a trajectory.
    assert result.adapter_stats["calls_served"] == len(calls) > 0
    assert result.adapter_stats["recording"]["events_failed"] == 0  # type: ignore[index]
    in_trees = Counter(c for t in trajectories.values() for c in t.call_ids)
    assert set(in_trees) == set(calls) and max(in_trees.values()) == 1

    # Weights changed while rollout ran, and the versions of the tokens show it.
    loads = [e for e in events if isinstance(e, ev.WeightsLoaded)]
    assert loads and max(e.version for e in loads) >= 2
    versions_seen = {v for c in calls.values() for v in c.output_versions}
    assert len(versions_seen) >= 2
    # Weights were updated mid-generation: calls that span the swap carry both versions, in order,
    # and their trajectories keep the per-token versions of both sides.
    mixed = [c for c in calls.values() if len(set(c.output_versions)) > 1]
    assert mixed, "no call spanned a weight update"
    for c in mixed:
        vs = list(c.output_versions)
        assert vs == sorted(vs)  # a call's tokens move forward in policy version, never back
        (holder,) = [t for t in trajectories.values() if c.call_id in t.call_ids]
        trained_versions = {v for n in holder.nodes for v, m in zip(n.versions, n.loss_mask, strict=True) if m}
        assert set(vs) <= trained_versions

    # The analytics store holds one row per event.
    from infra.analytics.config import AnalyticsConfig, open_store

    with open_store(AnalyticsConfig(data_dir=result.root / "analytics"), read_only=True) as store:
        assert store.count("llm_calls") == len(calls)
        assert store.count("trajectories") == len(trajectories)
