"""The local stack: where its Kafka cluster lives and how to reach it.

`sflow up` starts a one-node (or three-node) KRaft cluster under `var/kafka/` and creates the catalog
topics; `sflow down` stops it. Services find the brokers through `SFLOW_BOOTSTRAP` (set by the
launcher) or the defaults below.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from bus.admin import ensure_topics
from bus.config import BusConfig
from infra.kafka.cluster import REPO_ROOT, KafkaCluster

VAR_DIR: Final = Path(os.environ.get("SFLOW_VAR", REPO_ROOT / "var"))
SINGLE_PORT: Final = 9092
TRIPLE_PORT: Final = 9192


def cluster(nodes: int = 1) -> KafkaCluster:
    """The stack's cluster: one node on 9092, or three on 9192-9194 (controllers on +100)."""
    if nodes == 1:
        return KafkaCluster(VAR_DIR / "kafka" / "single", nodes=1, base_port=SINGLE_PORT)
    return KafkaCluster(VAR_DIR / "kafka" / "triple", nodes=3, base_port=TRIPLE_PORT)


def running_cluster() -> KafkaCluster | None:
    for nodes in (1, 3):
        c = cluster(nodes)
        if c.running():
            return c
    return None


def bus_config(client_id: str = "sflow", nodes: int | None = None) -> BusConfig:
    """Env first (a launched service), else the running local cluster, else the one-node default."""
    if "SFLOW_BOOTSTRAP" in os.environ:
        return BusConfig.from_env(client_id)
    c = cluster(nodes) if nodes else running_cluster() or cluster(1)
    return BusConfig(
        bootstrap_servers=c.bootstrap_servers,
        client_id=client_id,
        replication_factor=c.replication_factor,
        topic_prefix=os.environ.get("SFLOW_TOPIC_PREFIX", "sf."),
    )


def up(nodes: int = 1) -> BusConfig:
    c = cluster(nodes)
    c.start()
    config = bus_config(nodes=nodes)
    ensure_topics(config)
    return config


def down() -> list[str]:
    """Stops the services of every recorded run, then the brokers."""
    from infra.launcher import stop_recorded

    stopped = []
    for pid_file in sorted((REPO_ROOT / "runs").glob("*/pids.json")):
        stopped += [f"{pid_file.parent.name}/{name}" for name in stop_recorded(pid_file.parent)]
    for nodes in (1, 3):
        c = cluster(nodes)
        if c.running():
            c.stop()
            stopped.append(c.bootstrap_servers)
    return stopped
