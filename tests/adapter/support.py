"""Helpers of the capture-proxy tests: free ports, uvicorn in a thread, engine subprocesses, waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bus.ports import free_port
from bus.process import ManagedProcess

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def serve(app: Any, port: int) -> Iterator[str]:
    """Runs an ASGI app under uvicorn in a thread; yields its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


class EngineProcess(ManagedProcess):
    """`python -m inference_svc` in a subprocess (a second engine process); killable mid-call."""

    def __init__(self, model_dir: Path, resource_id: str, weight_version: int = 0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__("inference_svc", [
            "--model-path", str(model_dir), "--port", str(self.port), "--resource-id", resource_id,
            "--max-context", "1024", "--num-threads", "1", "--weight-version", str(weight_version),
            "--log-level", "warning"], cwd=REPO, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
            name=f"engine-{resource_id}", stop_timeout_s=10.0)
        self.start()

    def wait_ready(self, timeout_s: float = 120.0) -> EngineProcess:
        self.wait_healthy(f"{self.url}/model_info", timeout_s)
        return self

def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.002) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval_s)


def engine_inputs(engine: Any, monkeypatch: Any) -> dict[str, tuple[list[int], Any]]:
    """What a native engine is asked, by request id: its input ids and the future of its answer (the
    record a token-in/token-out test compares `llm.calls` with, never re-tokenized)."""
    seen: dict[str, tuple[list[int], Any]] = {}
    original = engine.submit

    def recording_submit(input_ids: list[int], sampling: Any = None, *, rid: str | None = None,
                         listener: Any = None) -> Any:
        future = original(input_ids, sampling, rid=rid, listener=listener)
        seen[str(rid)] = (list(input_ids), future)
        return future

    monkeypatch.setattr(engine, "submit", recording_submit)
    return seen
