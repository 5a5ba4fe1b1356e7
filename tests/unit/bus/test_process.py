"""ManagedProcess on a tiny python program: healthy by log line, condition or URL; stop, kill, restart."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from bus.errors import ProcessError
from bus.process import ManagedProcess

pytestmark = pytest.mark.unit

PROGRAM = """
import http.server, os, signal, sys, threading
mode = sys.argv[1]
if mode == "crash":
    print("about to fail", flush=True)
    sys.exit(3)
if mode == "deaf":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
stop = threading.Event()
if mode != "deaf":
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(f"ready port={server.server_port} env={os.environ.get('TINY_ENV', '')}", flush=True)
stop.wait()
print("stopping cleanly", flush=True)
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    package = tmp_path / "tinyprog"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(PROGRAM)
    return tmp_path


def managed(tiny: Path, mode: str) -> ManagedProcess:
    return ManagedProcess("tinyprog", [mode], log=tiny / "tiny.log", env={"TINY_ENV": "set"}, cwd=tiny)


def port_of(text: str) -> int:
    return int(text.split("port=", 1)[1].split()[0])


def test_starts_waits_for_a_log_line_and_stops_with_sigterm(tiny: Path) -> None:
    proc = managed(tiny, "serve").start()
    try:
        text = proc.wait_for_log("ready", timeout_s=30)
        assert "env=set" in text and proc.running()
        proc.wait_healthy(f"http://127.0.0.1:{port_of(text)}/", timeout_s=30)
        assert proc.wait_until(lambda: "ready" in proc.this_start_log(), "ready", timeout_s=5)
    finally:
        status = proc.stop(timeout_s=30)
    assert status == 0 and "stopping cleanly" in proc.tail()


def test_a_restart_waits_on_its_own_log_lines(tiny: Path) -> None:
    proc = managed(tiny, "serve").start()
    try:
        proc.wait_for_log("ready", timeout_s=30)
        proc.kill()
        assert not proc.running() and proc.returncode == -signal.SIGKILL
        proc.start(note="second")
        assert proc.starts == 2 and "start 2 (second)" in proc.log.read_text()
        assert "ready" not in proc.this_start_log() or proc.running()
        proc.wait_for_log("ready", timeout_s=30)
    finally:
        proc.stop(timeout_s=30)
    with pytest.raises(ProcessError, match="never started"):
        ManagedProcess("tinyprog").pid  # noqa: B018 - the property raises


def test_an_exit_fails_the_wait_with_the_log(tiny: Path) -> None:
    proc = managed(tiny, "crash").start()
    with pytest.raises(ProcessError, match=r"exited \(3\)[\s\S]*about to fail"):
        proc.wait_for_log("never printed", timeout_s=30)
    assert proc.wait_exit(5) == 3


def test_a_deadline_fails_the_wait_and_sigkill_follows_a_deaf_sigterm(tiny: Path) -> None:
    proc = managed(tiny, "deaf").start()
    try:
        proc.wait_for_log("ready", timeout_s=30)
        with pytest.raises(ProcessError, match=r"no log line 'never' within 0\.3s"):
            proc.wait_for_log("never", timeout_s=0.3)
        with pytest.raises(ProcessError, match="already running"):
            proc.start()
    finally:
        assert proc.stop(timeout_s=0.5) is None
    assert proc.returncode == -signal.SIGKILL


def test_without_a_log_path_the_log_is_a_temporary_file() -> None:
    proc = ManagedProcess("json.tool", ["--help"], name="jsontool").start()
    assert proc.wait_exit(30) == 0 and "usage" in proc.this_start_log()
    assert proc.log.name.startswith("jsontool-") and sys.executable
    proc.log.unlink()
