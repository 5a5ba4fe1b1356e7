"""A service under test: `python -m MODULE --flag value ...` (a `bus.process.ManagedProcess`) on the test's
Kafka topics (SFLOW_BOOTSTRAP / SFLOW_TOPIC_PREFIX), logging every start to one file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bus.config import BusConfig
from bus.process import ManagedProcess

REPO = Path(__file__).resolve().parents[1]


class ServiceProcess(ManagedProcess):
    """`options` become `--name value` flags at each start, so a test may change them between starts."""

    def __init__(self, module: str, bus: BusConfig, log: Path, options: dict[str, Any],
                 env: dict[str, str] | None = None) -> None:
        super().__init__(module, log=log, cwd=REPO, stop_timeout_s=30.0, env={
            "PYTHONPATH": str(REPO), "SFLOW_BOOTSTRAP": bus.bootstrap_servers, "SFLOW_TOPIC_PREFIX": bus.topic_prefix,
            **(env or {})})
        self.bus, self.options = bus, options

    def command(self) -> list[str]:
        out = super().command()
        for name, value in self.options.items():
            out += [f"--{name}", str(value)]
        return out
