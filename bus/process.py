"""A service as a child process: `python -m MODULE ...` started, waited on until healthy, stopped.

One helper for the stack launcher and the tests that run services for real. The child gets its own
process group (a stop or a SIGKILL reaches whatever it started too) and appends its output to one log
file, each start headed by a `===== start N =====` line so that a wait for a log line looks at this
start only. Healthy means a URL answering 200, a line in this start's log, or any condition, before a
deadline; a child that exits while it is waited on fails the wait at once, with the tail of its log.
Stopping is SIGTERM (the services finish the work in hand), then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from bus.errors import ProcessError

_POLL_S = 0.1
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # local services: never via a proxy


def answers_200(url: str, timeout_s: float = 2.0) -> bool:
    """Whether `url` answers HTTP 200 now."""
    try:
        with _DIRECT.open(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ManagedProcess:
    """One service process; `start` may be called again after it exited (a restart, same log)."""

    def __init__(self, module: str, args: Sequence[str] = (), *, log: Path | None = None,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None, cpus: Collection[int] | None = None,
                 name: str | None = None, stop_timeout_s: float = 20.0) -> None:
        self.module, self.args, self.cwd = module, list(args), cwd
        self.extra_env = dict(env or {})
        self.cpus = set(cpus) if cpus else None
        self.stop_timeout_s = stop_timeout_s
        self.name = name or module
        if log is None:
            handle, path = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
            os.close(handle)
            log = Path(path)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, *self.args]

    def environment(self) -> dict[str, str]:
        """The child's environment: this process's, unbuffered output, then `env`."""
        return {**os.environ, "PYTHONUNBUFFERED": "1", **self.extra_env}

    def _pin(self) -> None:
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)

    def start(self, note: str = "") -> ManagedProcess:
        """Starts the child (refused while one is running); `note` goes into this start's header line."""
        if self.running():
            raise ProcessError(f"{self.name} is already running (pid {self.pid})")
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"\n===== start {self.starts}{f' ({note})' if note else ''} =====\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.command(), cwd=self.cwd, env=self.environment(),
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=self._pin if self.cpus else None)
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ProcessError(f"{self.name} was never started")
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # --- waiting -------------------------------------------------------------------------------------

    def wait_until(self, condition: Callable[[], object], what: str, timeout_s: float,
                   interval_s: float = _POLL_S) -> object:
        """Polls `condition` until it returns something true (returned); raises `ProcessError` with the
        log's tail when the child exits first or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = condition()
            if result:
                return result
            if not self.running():
                raise ProcessError(f"{self.name} exited ({self.returncode}) while waiting for {what}; "
                                   f"log {self.log}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise ProcessError(f"{self.name}: no {what} within {timeout_s}s; log {self.log}:\n{self.tail()}")
            time.sleep(interval_s)

    def wait_healthy(self, url: str, timeout_s: float = 120.0) -> ManagedProcess:
        """Until `url` answers 200."""
        self.wait_until(lambda: answers_200(url), f"200 from {url}", timeout_s, interval_s=0.3)
        return self

    def wait_for_log(self, marker: str, timeout_s: float = 60.0) -> str:
        """Until this start logged `marker`; returns this start's log."""
        return str(self.wait_until(lambda: marker in (text := self.this_start_log()) and text,
                                   f"log line {marker!r}", timeout_s))

    def wait_exit(self, timeout_s: float) -> int:
        """The exit status; raises `ProcessError` when it still runs after `timeout_s`."""
        if self.proc is None:
            raise ProcessError(f"{self.name} was never started")
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise ProcessError(f"{self.name} still running after {timeout_s}s:\n{self.tail()}") from None

    # --- stopping ------------------------------------------------------------------------------------

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL to the whole group: nothing flushed, committed or closed (fault injection)."""
        if self.running():
            self._signal(signal.SIGKILL)
            self.wait_exit(10)

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM, then SIGKILL after `timeout_s` (default: `stop_timeout_s`); the exit status of a clean
        stop (None: killed, or never started)."""
        if self.proc is None:
            return None
        if not self.running():
            return self.proc.returncode
        self._signal(signal.SIGTERM)
        try:
            return self.proc.wait(self.stop_timeout_s if timeout_s is None else timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    # --- the log -------------------------------------------------------------------------------------

    def this_start_log(self) -> str:
        text = self.log.read_text(errors="replace")
        return text.rsplit(f"===== start {self.starts}", 1)[-1].split("=====\n", 1)[-1]

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
