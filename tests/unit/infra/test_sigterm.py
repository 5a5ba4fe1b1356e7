"""A job stopped with SIGTERM (`kill`, `timeout`, a batch system) unwinds like Ctrl-C, so what it started
(services, the broker) is stopped by its `finally`; Python's default would exit at once and leave them
running."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra import cli, demo
from infra.launcher import stop_on_sigterm

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
PROGRAM = """
import sys, time
from infra.launcher import stop_on_sigterm
stop_on_sigterm()
try:
    print("ready", flush=True)
    time.sleep(120)
finally:
    print("stopped what it started", flush=True)
"""


def test_sigterm_runs_the_programs_finally() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert "stopped what it started" in out


def test_sflow_train_stops_its_services_on_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    handlers: list[object] = []
    monkeypatch.setattr(demo, "run", lambda _config: handlers.append(signal.getsignal(signal.SIGTERM)))
    before = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(cli.app, ["train", "--config", str(REPO / "infra" / "configs" / "demo.yaml")])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == 0, result.output
    stop_on_sigterm()
    try:
        assert handlers == [signal.getsignal(signal.SIGTERM)]
    finally:
        signal.signal(signal.SIGTERM, before)
