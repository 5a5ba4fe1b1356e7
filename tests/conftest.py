"""Session fixtures: a real Kafka broker (KRaft, from the Maven-resolved jars) started for the test
session when a selected test needs one, and a fresh topic prefix per test so tests never see each
other's events."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus.admin import ensure_topics
from bus.config import BusConfig
from infra.kafka.cluster import KafkaCluster, free_base_port


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One broker for the whole session; stopped (by PID) when the session ends."""
    port = int(os.environ.get("SFLOW_TEST_KAFKA_PORT", "0")) or free_base_port()
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka"), nodes=1, base_port=port)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def bus_config(kafka_cluster: KafkaCluster) -> BusConfig:
    """A config whose topics (all catalog topics, created) belong to this test alone."""
    config = BusConfig(
        bootstrap_servers=kafka_cluster.bootstrap_servers,
        topic_prefix=f"t{uuid.uuid4().hex[:8]}.",
        client_id="pytest",
    )
    ensure_topics(config)
    return config


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


#: The agent frameworks tests/frameworks runs (the `frameworks` extra); their versions head every test run.
FRAMEWORKS = ("smolagents", "openai-agents", "langgraph", "langchain-openai", "pydantic-ai-slim", "mini-swe-agent",
              "litellm")


def pytest_report_header() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"{name} (not installed: pip install -e '.[frameworks]')"

    return "frameworks: " + ", ".join(installed(name) for name in FRAMEWORKS)
