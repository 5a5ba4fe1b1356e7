"""Fault tests: services SIGKILLed during a job and restarted, and a broker lost in the 3-node cluster.

The job must finish, and nothing served may be lost or trained twice: every recorded call is in
exactly one trajectory, every trajectory is trained at most once, and train steps are contiguous.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bus.config import BusConfig
from bus.replay import replay
from infra.demo import Fault, run
from infra.kafka.cluster import KafkaCluster, free_base_port
from infra.run_config import RunConfig
from schemas import events as ev
from tests.e2e.test_pipeline import CONFIG as PIPELINE_CONFIG

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(1200)]


def check_nothing_lost_or_doubled(bus: BusConfig, min_steps: int) -> None:
    events = [r.event for r in replay(bus, ["llm.calls", "trajectories", "train"]).events]
    calls = [e for e in events if isinstance(e, ev.LLMCall)]
    assert len({c.call_id for c in calls}) == len(calls)  # no call recorded twice
    trajectories = {e.trajectory_id: e for e in events if isinstance(e, ev.Trajectory)}
    in_trees = Counter(c for t in trajectories.values() for c in t.call_ids)
    closed = {c.call_id for c in calls if c.session_id in trajectories}
    assert closed <= set(in_trees) and max(in_trees.values(), default=1) == 1
    steps = sorted({e.step: e for e in events if isinstance(e, ev.TrainStepCompleted)}.items())
    assert len(steps) >= min_steps and [s for s, _ in steps] == list(range(1, len(steps) + 1))
    trained = [t for _, s in steps for t in s.trajectory_ids]
    assert len(trained) == len(set(trained))  # no trajectory trained twice


# The spatiotemporal layout with short generations.
CONFIG = {
    **PIPELINE_CONFIG,
    "inference": {"max_running_requests": 32, "resources": [
        {"id": "r0", "cpus": [0], "capabilities": ["rollout"]},
        {"id": "r1", "cpus": [1], "capabilities": ["rollout", "train"]},
    ]},
    "scheduler": {"policy": "spatiotemporal", "train_resources": 1, "train_batch_groups": 2,
                  "samples_per_task": 4, "max_staleness": 2},
    "agent": {"concurrency": 16, "max_turns": 2, "max_tokens": 120},
}


def config(base: dict[str, Any] = CONFIG, **changes: Any) -> RunConfig:
    return RunConfig.model_validate({**base, "run": {"max_steps": 7, "max_minutes": 12}, **changes})


@pytest.mark.parametrize("layout", [CONFIG, PIPELINE_CONFIG], ids=["spatiotemporal-short", "colocated-long"])
def test_each_service_killed_once_and_restarted(kafka_cluster: KafkaCluster, tmp_path: Path,
                                                layout: dict[str, Any]) -> None:
    faults = [Fault(1, "trajectories"), Fault(2, "infer-r0"), Fault(3, "scheduler"), Fault(4, "trainer"),
              Fault(5, "adapter")]
    result = run(config(layout), runs_root=tmp_path, cluster=kafka_cluster, faults=faults)
    assert result.state.steps >= 7
    check_nothing_lost_or_doubled(result.bus, 7)


def test_colocated_long_calls_survive_the_processor_killed_twice_and_the_proxy_once(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    """The schedule that stalled the job for good after step 2: the proxy's restart made the agents'
    calls fail, their sessions ended with no call, and the empty trajectories stalled the step."""
    faults = [Fault(1, "trajectories"), Fault(1, "trajectories"), Fault(2, "adapter")]
    result = run(config(PIPELINE_CONFIG, run={"max_steps": 5, "max_minutes": 10}), runs_root=tmp_path,
                 cluster=kafka_cluster, faults=faults)
    assert result.state.steps >= 5
    check_nothing_lost_or_doubled(result.bus, 5)


def test_job_goes_on_when_a_broker_of_three_dies(tmp_path: Path) -> None:
    cluster = KafkaCluster(tmp_path / "kafka", nodes=3, base_port=free_base_port(nodes=3), heap="384m")
    cluster.start(timeout_s=120)
    try:
        result = run(config(kafka={"nodes": 3}, run={"max_steps": 4, "max_minutes": 10}), runs_root=tmp_path,
                     cluster=cluster, faults=[Fault(1, "kafka-node-2")])
        assert result.state.steps >= 4
        check_nothing_lost_or_doubled(result.bus, 4)
    finally:
        cluster.stop()
