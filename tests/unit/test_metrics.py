"""The metric catalog and the shared plumbing (`bus.metrics`): names, exposition, metrics ports."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents_adapter.errors import ConfigError
from agents_adapter.processor.config import ProcessorConfig
from bus.metrics import CATALOG, MetricsError, ServiceMetrics

pytestmark = pytest.mark.unit


def _samples(metrics: ServiceMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_catalog_names_follow_prometheus_conventions() -> None:
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names))
    for m in CATALOG:
        assert m.name.startswith("sflow_") and m.help and m.unit
        assert m.name.endswith("_total") == (m.kind == "counter"), m.name
        assert (m.kind == "histogram") == bool(m.buckets), m.name


def test_values_are_read_at_scrape_time_and_a_failing_read_is_left_out() -> None:
    metrics, served = ServiceMetrics("proxy"), [3]
    metrics.read("sflow_proxy_calls_served_total", lambda: served[0])
    metrics.read("sflow_proxy_requests_failed_total", lambda: {("timeout",): 2})
    metrics.read("sflow_proxy_inflight_requests", lambda: 1 // 0)
    metrics.watch_consumer("g1", lambda: {"llm.calls": 5}, lambda: 1)
    metrics.histogram("sflow_proxy_added_latency_seconds").observe(0.004)
    served[0] = 7
    samples = _samples(metrics)
    assert samples[("sflow_proxy_calls_served_total", ())] == 7
    assert samples[("sflow_proxy_requests_failed_total", (("code", "timeout"),))] == 2
    assert samples[("sflow_consumer_lag_messages", (("group", "g1"), ("topic", "llm.calls")))] == 5
    assert samples[("sflow_dead_letters_total", (("group", "g1"),))] == 1
    assert samples[("sflow_proxy_added_latency_seconds_bucket", (("le", "0.005"),))] == 1
    assert samples[("sflow_proxy_added_latency_seconds_bucket", (("le", "0.0025"),))] == 0
    assert not any(name == "sflow_proxy_inflight_requests" for name, _ in samples)


def test_names_outside_the_catalog_or_of_another_kind_are_refused() -> None:
    metrics = ServiceMetrics("proxy")
    with pytest.raises(MetricsError, match="not in the metric catalog"):
        metrics.read("sflow_made_up_total", lambda: 1)
    with pytest.raises(MetricsError, match="is a counter"):
        metrics.gauge("sflow_proxy_calls_served_total")


def test_a_metrics_port_serves_the_registry_over_http() -> None:
    metrics = ServiceMetrics("trainer")
    metrics.read("sflow_trainer_trained_tokens_total", lambda: 42)
    server = metrics.serve("127.0.0.1", 0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read().decode()
    finally:
        server.close()
    assert "sflow_trainer_trained_tokens_total 42.0" in body


def test_the_metrics_port_is_validated_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="metrics_port=0"):
        ProcessorConfig(metrics_port=0)
    assert ProcessorConfig(metrics_port=9464).metrics_port == 9464
    assert ProcessorConfig.from_args(["--metrics-port", "9464"]).metrics_port == 9464


def catalog_table() -> str:
    """docs/operations.md's metric table, row for row from the catalog."""
    rows = ["| name | type | unit | labels | exported by | meaning |", "| --- | --- | --- | --- | --- | --- |"]
    rows += [f"| `{m.name}` | {m.kind} | {m.unit} | {', '.join(f'`{x}`' for x in m.labels) or '-'} | {m.service} "
             f"| {m.help} |" for m in CATALOG]
    return "\n".join(rows)


def test_the_operations_doc_table_is_the_catalog() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    table = doc.split("<!-- metrics-table:start -->\n")[1].split("\n<!-- metrics-table:end -->")[0]
    assert table == catalog_table(), "docs/operations.md's metric table differs from bus.metrics.CATALOG"
