"""Prometheus metrics of every service: the catalog of names, and the plumbing each process shares.

Why one catalog: the names, units and labels are a contract with whoever writes the dashboards and
alerts, like the topic catalog is with the consumers; docs/operations.md's table is this one (a unit test
compares them). Every name starts with `sflow_`, a counter ends with `_total`, a unit is the last word
before it (`_seconds`, `_tokens`, `_messages`).

Why it is cheap: most values are counters the services keep anyway (calls served, events recorded,
tokens generated, dead letters); they are read when Prometheus scrapes (`ServiceMetrics.read`), not
updated per call. Only histograms (the proxy's added latency, step times, sync pauses) are observed
as things happen, one `observe()` each (a lock and a bisect, about a microsecond).

Each process has its own `CollectorRegistry` (not prometheus_client's global one): a test may build
several services in one process. An HTTP service serves it at `GET /metrics` of its own port
(`add_metrics_route`), open like `/health`; a process without HTTP (trajectory processor, scheduler,
trainer) serves it on its `metrics_port` (`ServiceMetrics.serve`; off when the port is None).

API:
- `CATALOG` (`MetricSpec`: name, kind, unit, labels, help, service), `spec(name)`.
- `ServiceMetrics(service)`: `.histogram(name)` / `.gauge(name)` (prometheus_client objects made
  from the catalog), `.read(name, fn)` (a value read at scrape time: `fn()` returns a number, or a
  mapping of label-value tuples to numbers), `.watch_consumer(group, lag, dead_letters)` (consumer
  lag per topic and dead letters of one consumer, read at scrape time), `.exposition()`,
  `.serve(host, port) -> MetricsServer` (`.port`, `.close()`).
- `add_metrics_route(app, metrics)`: `GET /metrics` on a FastAPI app (imported where it is called).
- The config field types of a metrics port and its host are `bus.kit.MetricsPort` / `MetricsHost`
  (a config imports no Prometheus, nor this module's web framework).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bus.errors import BusError

log = logging.getLogger("sflow.bus.metrics")

Kind = Literal["counter", "gauge", "histogram"]
Reading = float | int | Mapping[tuple[str, ...], float | int]

# Added latency is milliseconds of tokenizing and a Kafka acknowledgement; steps and syncs are seconds.
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
DURATION_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class MetricsError(BusError):
    """A metric name outside the catalog, or a metrics port that cannot be served."""


@dataclass(frozen=True)
class MetricSpec:
    """One documented series: what `unit` it counts, which `labels` split it, which `service` exports it."""

    name: str
    kind: Kind
    unit: str
    labels: tuple[str, ...]
    help: str
    service: str
    buckets: tuple[float, ...] = ()


def _m(name: str, kind: Kind, unit: str, labels: tuple[str, ...], service: str, help_text: str,
       buckets: tuple[float, ...] = ()) -> MetricSpec:
    return MetricSpec(name, kind, unit, labels, help_text, service, buckets)


CATALOG: Final[tuple[MetricSpec, ...]] = (
    _m("sflow_proxy_calls_served_total", "counter", "calls", (), "proxy",
       "LLM calls answered (each one recorded on llm.calls first)"),
    _m("sflow_proxy_events_recorded_total", "counter", "events", (), "proxy",
       "LLMCall and session events Kafka acknowledged"),
    _m("sflow_proxy_events_record_failed_total", "counter", "events", (), "proxy",
       "events Kafka did not acknowledge in time (their requests failed with 503)"),
    _m("sflow_proxy_requests_failed_total", "counter", "requests", ("code",), "proxy",
       "call requests that failed, by error code"),
    _m("sflow_proxy_added_latency_seconds", "histogram", "seconds", (), "proxy",
       "a call's time in the proxy minus its time on the engines (prompt building, recording)", LATENCY_BUCKETS),
    _m("sflow_proxy_inflight_requests", "gauge", "requests", (), "proxy",
       "requests being served now (the proxy's queue)"),
    _m("sflow_inference_generated_tokens_total", "counter", "tokens", ("resource", "version"), "inference",
       "tokens sampled, by resource and policy version (tokens/s: rate() of it)"),
    _m("sflow_inference_requests", "gauge", "requests", ("resource", "state"), "inference",
       "requests in the engine, state running or queued (the engine's queue)"),
    _m("sflow_inference_requests_finished_total", "counter", "requests", ("resource",), "inference",
       "generation requests finished"),
    _m("sflow_inference_weight_version", "gauge", "version", ("resource",), "inference",
       "the policy version the engine samples with"),
    _m("sflow_inference_paused", "gauge", "boolean", ("resource",), "inference",
       "1 while the engine is paused (weight sync, preemption)"),
    _m("sflow_processor_trajectories_total", "counter", "trajectories", (), "processor",
       "Trajectory events published (a re-read input may publish one again)"),
    _m("sflow_processor_batches_ready_total", "counter", "groups", (), "processor",
       "BatchReady events published (task groups with all their samples)"),
    _m("sflow_scheduler_resource_tag", "gauge", "boolean", ("resource", "kind", "tag"), "scheduler",
       "1 for each tag a resource has now: kind capability (rollout, train) or activity (idle, rollout, ...)"),
    _m("sflow_scheduler_groups", "gauge", "groups", ("state",), "scheduler",
       "task groups dispatched and not yet trained (open), and those complete and waiting for a step (ready)"),
    _m("sflow_scheduler_decisions_total", "counter", "events", (), "scheduler",
       "decision events the scheduler published"),
    _m("sflow_scheduler_policy_version", "gauge", "version", (), "scheduler", "the newest policy version"),
    _m("sflow_weight_sync_pause_seconds", "histogram", "seconds", (), "scheduler",
       "from WeightSyncStarted (rollout paused) to WeightSyncCompleted (resumed)", DURATION_BUCKETS),
    _m("sflow_trainer_step_seconds", "histogram", "seconds", (), "trainer",
       "wall time of one train step (without the checkpoint)", DURATION_BUCKETS),
    _m("sflow_trainer_steps_total", "counter", "steps", ("status",), "trainer",
       "train steps, status completed or skipped"),
    _m("sflow_trainer_trained_tokens_total", "counter", "tokens", (), "trainer", "tokens trained on"),
    _m("sflow_trainer_loss", "gauge", "loss", (), "trainer", "the last step's loss"),
    _m("sflow_trainer_reward_mean", "gauge", "reward", (), "trainer", "the last step's mean reward"),
    _m("sflow_trainer_entropy", "gauge", "nats", (), "trainer", "the last step's mean policy entropy per token"),
    _m("sflow_trainer_response_length_mean", "gauge", "tokens", (), "trainer",
       "the last step's mean generated tokens per call"),
    _m("sflow_trainer_policy_version", "gauge", "version", (), "trainer", "the version the trainer holds"),
    _m("sflow_trainer_buffered_trajectories", "gauge", "trajectories", (), "trainer",
       "trajectories buffered and not yet trained (the trainer's queue)"),
    _m("sflow_consumer_lag_messages", "gauge", "messages", ("group", "topic"), "every consumer",
       "messages on the topic's assigned partitions the consumer has not read yet"),
    _m("sflow_dead_letters_total", "counter", "messages", ("group",), "every consumer",
       "messages this process sent to the dlq topic"),
)
_BY_NAME: Final = {m.name: m for m in CATALOG}


def spec(name: str) -> MetricSpec:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise MetricsError(f"{name!r} is not in the metric catalog (bus.metrics.CATALOG)") from None


def _family(metric: MetricSpec) -> CounterMetricFamily | GaugeMetricFamily:
    kind = CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily
    return kind(metric.name, metric.help, labels=metric.labels, unit="")


def _add(family: CounterMetricFamily | GaugeMetricFamily, reading: Reading) -> None:
    if isinstance(reading, Mapping):
        for labels, value in reading.items():
            family.add_metric(list(labels), float(value))
    else:
        family.add_metric([], float(reading))


class _ScrapeTime(Collector):
    """Families whose values are read when Prometheus scrapes; a reading that fails is left out (a
    consumer closed at shutdown must not fail the whole scrape)."""

    def __init__(self) -> None:
        self._reads: list[tuple[MetricSpec, Callable[[], Reading]]] = []
        self._consumers: list[tuple[str, Callable[[], Mapping[str, int]], Callable[[], int]]] = []
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            reads, consumers = list(self._reads), list(self._consumers)
        for metric, read in reads:
            family = _family(metric)
            try:
                _add(family, read())
            except Exception as e:
                log.debug("metric %s not read: %s", metric.name, e)
            yield family
        if consumers:
            lag, dead = _family(spec("sflow_consumer_lag_messages")), _family(spec("sflow_dead_letters_total"))
            for group, read_lag, read_dead in consumers:
                try:
                    lags, letters = read_lag(), read_dead()
                except Exception as e:
                    log.debug("consumer %s not read: %s", group, e)
                    continue
                _add(lag, {(group, topic): n for topic, n in lags.items()})
                _add(dead, {(group,): letters})
            yield from (lag, dead)


class MetricsServer:
    """The metrics HTTP server of a process without HTTP of its own (a daemon thread)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            raise MetricsError(f"metrics_port={port}: cannot serve metrics on {host}:{port}: {e}") from e
        self.port = int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class ServiceMetrics:
    """The metrics of one service instance (see the module docstring)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=False)
        self._scrape_time = _ScrapeTime()
        self.registry.register(self._scrape_time)

    def histogram(self, name: str) -> Histogram:
        metric = self._spec(name, "histogram")
        return Histogram(name, metric.help, metric.labels, registry=self.registry, buckets=metric.buckets)

    def gauge(self, name: str) -> Gauge:
        metric = self._spec(name, "gauge")
        return Gauge(name, metric.help, metric.labels, registry=self.registry)

    def read(self, name: str, read: Callable[[], Reading]) -> None:
        metric = spec(name)
        if metric.kind == "histogram":
            raise MetricsError(f"{name}: a histogram is observed, not read")
        with self._scrape_time._lock:
            self._scrape_time._reads.append((metric, read))

    def watch_consumer(self, group: str, lag: Callable[[], Mapping[str, int]], dead_letters: Callable[[], int]) -> None:
        """Exports one consumer's lag per topic and its dead letters (labelled by its group)."""
        with self._scrape_time._lock:
            self._scrape_time._consumers.append((group, lag, dead_letters))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> MetricsServer:
        return MetricsServer(self.registry, host, port)

    @staticmethod
    def _spec(name: str, kind: Kind) -> MetricSpec:
        metric = spec(name)
        if metric.kind != kind:
            raise MetricsError(f"{name} is a {metric.kind} in the catalog, not a {kind}")
        return metric


def add_metrics_route(app: Any, metrics: ServiceMetrics) -> None:
    """`GET /metrics` on a FastAPI app, outside its OpenAPI document (it is no part of the service's API)."""
    from starlette.responses import Response

    async def exposition() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    app.add_api_route("/metrics", exposition, methods=["GET"], include_in_schema=False)
