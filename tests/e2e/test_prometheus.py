"""A real Prometheus server scrapes every service of a short job (`infra.demo.run`, the `make demo` path).

Debian's `prometheus` binary is installed by `make test` (the Makefile's `packages` target); without
it the test skips, saying so (`tests/system_packages.py`). The demo writes the run's scrape config
(`prometheus.yml`); Prometheus
runs on it (scraping every 2 s) while the job runs, and the test asks Prometheus' HTTP API which
series it stored: each service's catalog series (`bus.metrics.CATALOG`) under that service's job, with
the values the job produced (calls served, tokens per resource and version, trajectories, groups).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bus.metrics import CATALOG
from bus.ports import free_port
from infra.demo import run
from infra.kafka.cluster import KafkaCluster
from infra.prometheus import PrometheusServer, wait_for
from infra.run_config import RunConfig
from tests.system_packages import require

pytestmark = [
    pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(300),
    pytest.mark.skipif(require({"prometheus": "prometheus"}) is not None,
                       reason=require({"prometheus": "prometheus"}) or ""),
]

CONFIG = {
    "name": "prom",
    "model": {"warmup_tasks": 32, "warmup_steps": 10},
    "tasks": {"count": 16},
    "inference": {"max_running_requests": 8, "resources": [
        {"id": "r0", "cpus": [0, 1], "capabilities": ["rollout", "train"]},
    ]},
    "scheduler": {"policy": "colocated", "train_resources": 1, "train_batch_groups": 1, "samples_per_task": 2,
                  "max_staleness": 1},
    "agent": {"concurrency": 4, "max_turns": 1, "max_tokens": 24},
    # the job stops soon after Prometheus has scraped it (on_started returns then): a train step is not
    # waited for, the CPU-only trainer's start-up alone takes minutes on a loaded 2-core machine
    "run": {"max_steps": 1, "max_minutes": 0.1},
}
SERVICE_JOBS = {"proxy": "adapter", "inference": "infer-r0", "processor": "trajectories",
                "scheduler": "scheduler", "trainer": "trainer"}
# no series until a request fails / a step ends (the trainer's other series exist from its start)
ON_EVENT_ONLY = {"sflow_proxy_requests_failed_total", "sflow_trainer_steps_total"}
# the job's work, by each service that does it (each target is scraped on its own clock)
JOB_WORK = ("sflow_processor_trajectories_total", "sflow_processor_batches_ready_total",
            "sflow_proxy_calls_served_total", "sflow_proxy_added_latency_seconds_count",
            "sflow_inference_generated_tokens_total")


def _latest(server: PrometheusServer, selector: str) -> list[dict[str, Any]]:
    """The last sample of each series of `selector`: one scrape that timed out on the loaded machine
    marks a series stale, and a plain instant query then leaves it out."""
    return server.query(f"last_over_time({selector}[10m])")


def _value(server: PrometheusServer, selector: str) -> float:
    result = _latest(server, selector)
    return float(result[0]["value"][1]) if result else 0.0


def _catalog_series() -> list[tuple[str, str]]:
    """(series name, job) of every catalog series a short job must have stored."""
    out = []
    for metric in CATALOG:
        if metric.name in ON_EVENT_ONLY:
            continue
        name = metric.name + "_count" if metric.kind == "histogram" else metric.name
        # every consumer's: the trainer's consumer exists only once its model and optimizer are loaded (minutes
        # for DeepSpeed on a loaded 2-core machine), so its lag is not waited for here
        jobs = [j for j in SERVICE_JOBS.values() if j != "trainer"] if metric.service == "every consumer" else [
            SERVICE_JOBS[metric.service]]
        out += [(name, job) for job in jobs]
    return out


def _stored(server: PrometheusServer) -> set[tuple[str, str]]:
    """(series name, job) of every sflow_ series Prometheus stored."""
    return {(labels["__name__"], labels["job"]) for labels in server.series('{__name__=~"sflow_.+"}')}


def test_prometheus_scrapes_every_service_of_a_short_job(kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def scrape_while_running(root: Path) -> None:
        scrape = yaml.safe_load((root / "prometheus.yml").read_text())
        assert {job["job_name"] for job in scrape["scrape_configs"]} == set(SERVICE_JOBS.values())
        scrape["global"] = {"scrape_interval": "2s", "scrape_timeout": "2s"}
        fast = tmp_path / "prometheus-2s.yml"
        fast.write_text(yaml.safe_dump(scrape))
        server = PrometheusServer(fast, tmp_path / "prometheus-data", free_port())
        try:
            server.wait_ready()
            wait_for(lambda: all(t["health"] == "up" for t in server.targets()) and len(server.targets()) == 5,
                     60, "every service's target up")
            # the job's own work, as Prometheus stored it: calls served, their tokens, their trajectories, a ready
            # group (counters: a group is `ready` on the scheduler's gauge only until it is assigned, often
            # between two scrapes), and every catalog series. Each target is scraped on its own clock, so all of
            # them are waited for: one service's series can be stored before another's next scrape shows what
            # made them (seen: the engine's tokens, the scheduler's resource tags missing).
            catalog = set(_catalog_series())
            wait_for(lambda: all(_value(server, series) > 0 for series in JOB_WORK) and catalog <= _stored(server),
                     120, "the job's work and every catalog series scraped")
            seen["stored"] = _stored(server)
            seen["calls"] = _value(server, "sflow_proxy_calls_served_total")
            seen["tokens"] = _latest(server, "sflow_inference_generated_tokens_total")
            seen["trajectories"] = _value(server, "sflow_processor_trajectories_total")
            seen["lag_topics"] = {(r["metric"]["job"], r["metric"]["topic"])
                                  for r in _latest(server, "sflow_consumer_lag_messages")}
            seen["tags"] = {(r["metric"]["kind"], r["metric"]["tag"])
                            for r in _latest(server, 'sflow_scheduler_resource_tag{resource="r0"}')}
            seen["latency_count"] = _value(server, "sflow_proxy_added_latency_seconds_count")
        finally:
            server.stop()

    result = run(RunConfig.model_validate(CONFIG), runs_root=tmp_path, cluster=kafka_cluster,
                 on_started=scrape_while_running)

    missing = [(name, job) for name, job in _catalog_series() if (name, job) not in seen["stored"]]
    assert not missing, f"not scraped (series, job): {missing}"
    # the values are the job's: what the proxy served is on the bus, tokens carry resource and version
    assert 0 < seen["calls"] <= result.adapter_stats["calls_served"]
    assert seen["latency_count"] > 0
    assert {r["metric"]["resource"] for r in seen["tokens"]} == {"r0"}
    assert all(r["metric"]["version"].isdigit() and float(r["value"][1]) > 0 for r in seen["tokens"])
    assert seen["trajectories"] > 0
    assert {("scheduler", "trajectories"), ("trajectories", "llm.calls"),
            ("infer-r0", "control"), ("adapter", "resources")} <= seen["lag_topics"]
    assert ("capability", "rollout") in seen["tags"] and ("capability", "train") in seen["tags"]
