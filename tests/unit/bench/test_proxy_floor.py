"""bench/proxy_floor.py's parts and bench/adapter_bench.py's CPU clock: each floor variant leaves out exactly
the part it names (else "the floor less the floor without it" would not be that part's cost), and the CPU clock
resolves the tenths of a millisecond per call that the bench compares."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.unit.bench.bench_modules import load_bench

pytestmark = pytest.mark.unit

proxy_floor = load_bench("proxy_floor")
load_bench("proxy_steps")  # adapter_bench imports both from its own directory
adapter_bench = load_bench("adapter_bench")


def _served(app: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One POST through the ASGI callable: its status and JSON body."""
    sent: list[dict[str, Any]] = []
    incoming = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "http", "method": "POST", "path": "/v1/chat/completions"}, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])


def _stored_rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])


@pytest.mark.parametrize("without", [frozenset({"engine"}), frozenset({"engine", "store"})])
def test_a_floor_without_parts_answers_and_stores_only_what_it_keeps(tmp_path: Path, without: frozenset[str]) -> None:
    # no producer: the Kafka part is left out too; the engine URL points nowhere, so a request to it would fail
    app = proxy_floor.FloorApp("http://127.0.0.1:9", None, "unused", tmp_path / "calls.db", without)
    status, reply = _served(app, {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and reply["object"] == "chat.completion"
    assert _stored_rows(tmp_path / "calls.db") == (0 if "store" in without else 1)


def test_every_part_has_a_variant_without_it_and_one_without_all() -> None:
    assert set(proxy_floor.PARTS) == {"engine", "store", "kafka"}
    variants = adapter_bench.FLOOR_VARIANTS
    assert variants[""] == () and set(variants["server"]) == set(proxy_floor.PARTS)
    assert all(variants[part] == (part,) for part in proxy_floor.PARTS)


def test_the_cpu_clock_counts_what_the_process_spent_below_a_clock_tick() -> None:
    me = psutil.Process()
    before, started = adapter_bench.process_cpu_ms(me), time.process_time()
    deadline = started + 0.004  # 4 ms of CPU: below psutil's 10 ms tick
    while time.process_time() < deadline:
        pass
    spent = adapter_bench.process_cpu_ms(me) - before
    assert 3.0 < spent < 4.0 + 1000 * (time.process_time() - deadline) + 2.0
