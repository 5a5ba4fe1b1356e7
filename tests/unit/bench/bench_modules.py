"""The benchmarks under bench/ are scripts, not a package: their pure parts are imported by path."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parents[3] / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/<name>.py as a module (registered in sys.modules, so its dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def post_asgi(app: Any, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One POST of a JSON body through a raw ASGI callable (a bench's server): its status and JSON reply."""
    sent: list[dict[str, Any]] = []
    incoming = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "http", "method": "POST", "path": path}, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])
