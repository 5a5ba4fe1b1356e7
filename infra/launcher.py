"""Starts the project's services as child processes and stops every one of them.

Each service runs as `python -m PACKAGE ...` in its own process group with its log in the run
folder, optionally pinned to a share of the cores (a "logical resource" on a small machine). The
launcher remembers PIDs on disk, so `sflow down` stops what an earlier `sflow up` started, and fault
tests can SIGKILL one service and start it again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bus.errors import ProcessError
from bus.process import ManagedProcess
from infra.errors import InfraError

log = logging.getLogger("sflow.launcher")


@dataclass(frozen=True)
class ServiceSpec:
    """How to run one service.

    name: unique within a run (e.g. "infer-r0"). module: run as `python -m module`.
    cpus: cores the process may use (None: all). threads: torch/BLAS threads.
    health_url: polled until it answers 200 (None: started means ready).
    metrics_url: where Prometheus scrapes its `bus.metrics` series (None: it exports none).
    """

    name: str
    module: str
    args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    cpus: Sequence[int] | None = None
    threads: int = 1
    health_url: str | None = None
    metrics_url: str | None = None


class Launcher:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pid_file = run_dir / "pids.json"
        self.specs: dict[str, ServiceSpec] = {}
        self.procs: dict[str, ManagedProcess] = {}

    def _write_pids(self) -> None:
        pids = {name: p.pid for name, p in self.procs.items() if p.running()}
        self.pid_file.write_text(json.dumps(pids))

    def _process(self, spec: ServiceSpec) -> ManagedProcess:
        threads = str(spec.threads)
        env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
               "SFLOW_TORCH_THREADS": threads, "TOKENIZERS_PARALLELISM": "false", **spec.env}
        return ManagedProcess(spec.module, spec.args, log=self.logs / f"{spec.name}.log", env=env, cpus=spec.cpus,
                              name=spec.name)

    def start_together(self, specs: Sequence[ServiceSpec], wait_s: float = 120.0) -> None:
        """Starts every service, then waits for each to be healthy: services that need nothing of each other
        (the inference engines, on cores of their own) load their models at the same time."""
        for spec in specs:
            self.start(spec, wait_s=None)
        for spec in specs:
            if spec.health_url:
                self.wait_healthy(spec, wait_s)

    def start(self, spec: ServiceSpec, wait_s: float | None = 120.0) -> None:
        """Starts a service and waits up to `wait_s` for it to be healthy (None: does not wait)."""
        known = self.procs.get(spec.name)
        if known is not None and known.running():
            raise InfraError(f"service {spec.name} is already running (pid {known.pid})")
        proc = known if known is not None and self.specs[spec.name] == spec else self._process(spec)
        proc.start()
        self.specs[spec.name] = spec
        self.procs[spec.name] = proc
        self._write_pids()
        log.info("started", extra={"service_name": spec.name, "pid": proc.pid})
        if spec.health_url and wait_s is not None:
            self.wait_healthy(spec, wait_s)

    def wait_healthy(self, spec: ServiceSpec, wait_s: float) -> None:
        try:
            self.procs[spec.name].wait_healthy(spec.health_url or "", wait_s)
        except ProcessError as e:
            raise InfraError(str(e)) from e

    def kill(self, name: str) -> None:
        """SIGKILL one service (fault injection)."""
        self.procs[name].kill()
        self._write_pids()

    def restart(self, name: str, wait_s: float = 120.0) -> None:
        self.start(self.specs[name], wait_s)

    def running(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.running()]

    def stop(self, name: str, timeout_s: float = 20.0) -> None:
        proc = self.procs.get(name)
        if proc is not None:
            proc.stop(timeout_s)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)
        self._write_pids()

def stop_recorded(run_dir: Path) -> list[str]:
    """Stops the services an earlier launcher recorded in `run_dir/pids.json` (for `sflow down`)."""
    pid_file = run_dir / "pids.json"
    if not pid_file.exists():
        return []
    stopped = []
    for name, pid in json.loads(pid_file.read_text()).items():
        try:
            os.killpg(pid, signal.SIGTERM)
            stopped.append(name)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 20
    for pid in json.loads(pid_file.read_text()).values():
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    pid_file.unlink()
    return stopped


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so a program's `finally` stops every service and broker it started (a
    background job ignores SIGINT, and `timeout` sends SIGTERM: without this, Python would exit at once and
    leave them running)."""
    signal.signal(signal.SIGTERM, _interrupt)
