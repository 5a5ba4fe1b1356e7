"""The local cluster launcher and the `sflow events tail` command, against real brokers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bus.admin import ensure_topics
from bus.config import BusConfig
from bus.producer import EventProducer
from bus.replay import replay
from infra.kafka.cluster import KafkaCluster, free_base_port
from schemas import events as ev
from tests.factories import example

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


def test_events_tail_prints_decoded_filtered_events(bus_config: BusConfig) -> None:
    with EventProducer(bus_config) as producer:
        for i in range(4):
            producer.publish_sync(example(ev.LLMCall, i, session_id=f"s{i % 2}", prompt_ids=list(range(100))))
        producer.publish_sync(example(ev.Heartbeat, 0, resource_id="r9"))
    env = {**os.environ, "SFLOW_BOOTSTRAP": bus_config.bootstrap_servers, "SFLOW_TOPIC_PREFIX": bus_config.topic_prefix}
    out = subprocess.run(
        [sys.executable, "-m", "infra.cli", "events", "tail", "llm.calls", "--from-beginning",
         "--session", "s1", "--idle-exit", "3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["session_id"] for line in lines] == ["s1", "s1"]
    assert lines[0]["type"] == "LLMCall" and "(100 items)" in lines[0]["prompt_ids"]
    out = subprocess.run(
        [sys.executable, "-m", "infra.cli", "events", "tail", "resources", "--from-beginning",
         "--resource", "r9", "--limit", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert json.loads(out.stdout)["resource_id"] == "r9"


def test_unknown_topic_is_refused_with_the_catalog(bus_config: BusConfig) -> None:
    env = {**os.environ, "SFLOW_BOOTSTRAP": bus_config.bootstrap_servers}
    out = subprocess.run([sys.executable, "-m", "infra.cli", "events", "tail", "nope"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "no catalog topic 'nope'" in (out.stderr + out.stdout)


def test_second_start_reuses_storage_and_running_node(tmp_path: Path) -> None:
    cluster = KafkaCluster(tmp_path, nodes=1, base_port=free_base_port())
    cluster.start()
    try:
        pid = cluster.nodes[0].pid()
        cluster.start()  # idempotent: the running node is left alone
        assert cluster.nodes[0].pid() == pid
        cluster.stop()
        assert cluster.running() == []
        cluster.start()  # formatted storage is reused
        assert (cluster.nodes[0].directory / "data" / "meta.properties").exists()
    finally:
        cluster.stop()


@pytest.mark.slow
def test_three_broker_cluster_survives_one_broker_killed(tmp_path: Path) -> None:
    """RF 3 with min ISR 2: acks=all writes go on while one broker is down, and nothing is lost."""
    cluster = KafkaCluster(tmp_path, nodes=3, base_port=free_base_port(nodes=3), heap="384m")
    cluster.start(timeout_s=120)
    try:
        config = BusConfig(bootstrap_servers=cluster.bootstrap_servers, topic_prefix="rf3.", replication_factor=3)
        ensure_topics(config)
        sent = []
        with EventProducer(config, delivery_timeout_ms=60_000) as producer:
            for i in range(50):
                sent.append(producer.publish_sync(example(ev.Heartbeat, i, resource_id=f"r{i}")).offset)
            cluster.stop_node(cluster.nodes[1], kill=True)
            t0 = time.monotonic()
            for i in range(50, 100):
                producer.publish_sync(example(ev.Heartbeat, i, resource_id=f"r{i}"))
            assert time.monotonic() - t0 < 60
        events = replay(config, ["resources"]).events
        assert sorted(r.event.resource_id for r in events) == sorted(f"r{i}" for i in range(100))  # type: ignore[attr-defined]
    finally:
        cluster.stop()
