"""Scraping a run with Prometheus: the run's scrape config, and a local Prometheus server.

Every service of a run exports the series of `bus.metrics.CATALOG`: the capture proxy and the
inference services at `/metrics` of their HTTP port, the trajectory processor, scheduler and trainer
on their `--metrics-port`. The demo writes `runs/<run>/prometheus.yml` with one job per service
(`write_scrape_config`), so `prometheus --config.file runs/<run>/prometheus.yml` scrapes a live run.

`PrometheusServer` runs Debian's `prometheus` binary (`apt-get install prometheus`) on that file,
with its data in a folder of its own; `query(promql)` asks its HTTP API. The tests use it to show
that the series are really scraped.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

from infra.errors import InfraError
from infra.launcher import ServiceSpec

T = TypeVar("T")


def scrape_config(specs: Iterable[ServiceSpec], interval_s: float = 5.0) -> dict[str, Any]:
    """One scrape job per service that exports metrics (job = the service's name)."""
    jobs = []
    for spec in specs:
        if spec.metrics_url is None:
            continue
        url = urlsplit(spec.metrics_url)
        jobs.append({"job_name": spec.name, "metrics_path": url.path or "/metrics",
                     "static_configs": [{"targets": [url.netloc]}]})
    interval = f"{max(1, round(interval_s * 1000))}ms"
    return {"global": {"scrape_interval": interval, "scrape_timeout": interval}, "scrape_configs": jobs}


def write_scrape_config(path: Path, specs: Iterable[ServiceSpec], interval_s: float = 5.0) -> Path:
    path.write_text(yaml.safe_dump(scrape_config(specs, interval_s), sort_keys=False), encoding="utf-8")
    return path


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class PrometheusServer:
    """A Prometheus server on `config_file`, listening on 127.0.0.1:`port`; `stop()` ends it."""

    def __init__(self, config_file: Path, data_dir: Path, port: int) -> None:
        binary = prometheus_binary()
        if binary is None:
            raise InfraError("prometheus is not installed (Debian: apt-get install prometheus)")
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = data_dir / "prometheus.log"
        data_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            [binary, f"--config.file={config_file}", f"--storage.tsdb.path={data_dir}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        import httpx

        def ready() -> bool:
            if self._process.poll() is not None:
                raise InfraError(f"prometheus exited with {self._process.returncode}: see {self.log_path}")
            try:
                return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout_s, "prometheus ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector of `promql` (its `result` list: each a `metric` label map and a `value`)."""
        import httpx

        reply = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10).json()
        if reply.get("status") != "success":
            raise InfraError(f"prometheus query {promql!r} failed: {reply}")
        return list(reply["data"]["result"])

    def series(self, match: str) -> list[dict[str, str]]:
        """The label sets of every series matching `match` stored so far, stale ones included (an instant
        query leaves out a series whose last scrape failed: Prometheus marks it stale)."""
        import httpx

        reply = httpx.get(f"{self.url}/api/v1/series", params={"match[]": match, "start": "0"}, timeout=10).json()
        if reply.get("status") != "success":
            raise InfraError(f"prometheus series {match!r} failed: {reply}")
        return list(reply["data"])

    def targets(self) -> list[dict[str, Any]]:
        import httpx

        return list(httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"])

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.25) -> T:
    """`condition()`'s first truthy value, polled until `timeout_s`; InfraError naming `what` after that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise InfraError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
