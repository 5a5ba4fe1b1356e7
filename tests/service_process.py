"""A service under test: `python -m MODULE --flag value ...` in its own process group, on the test's
Kafka topics (SFLOW_BOOTSTRAP / SFLOW_TOPIC_PREFIX), logging every start to one file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bus.config import BusConfig

REPO = Path(__file__).resolve().parents[1]


class ServiceProcess:
    def __init__(self, module: str, bus: BusConfig, log: Path, options: dict[str, Any]) -> None:
        self.module, self.bus, self.log, self.options = module, bus, log, options
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def args(self) -> list[str]:
        out = [sys.executable, "-m", self.module]
        for name, value in self.options.items():
            out += [f"--{name}", str(value)]
        return out

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(REPO), "SFLOW_BOOTSTRAP": self.bus.bootstrap_servers,
                "SFLOW_TOPIC_PREFIX": self.bus.topic_prefix}

    def start(self) -> ServiceProcess:
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"\n===== start {self.starts} =====\n".encode())
            self.proc = subprocess.Popen(self.args(), cwd=REPO, env=self.env(), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def this_start_log(self) -> str:
        return self.log.read_text(errors="replace").rsplit(f"===== start {self.starts} =====", 1)[-1]

    def wait_for_log(self, marker: str, timeout_s: float = 60.0) -> str:
        """Until this start logged `marker`; returns this start's log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.this_start_log()
            if marker in text:
                return text
            assert self.proc is not None and self.proc.poll() is None, f"{self.module} exited:\n{self.tail()}"
            time.sleep(0.1)
        raise AssertionError(f"{self.module} did not log {marker!r} within {timeout_s}s:\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL: no flush, no commit, no leaving the group."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
