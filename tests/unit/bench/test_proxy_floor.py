"""bench/proxy_floor.py's parts and bench/adapter_bench.py's CPU clock: each floor variant leaves out exactly
the part it names (else "the floor less the floor without it" would not be that part's cost), and the CPU clock
resolves the tenths of a millisecond per call that the bench compares."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.unit.bench.bench_modules import load_bench, post_asgi

pytestmark = pytest.mark.unit

proxy_floor = load_bench("proxy_floor")
load_bench("proxy_steps")  # adapter_bench imports both from its own directory
adapter_bench = load_bench("adapter_bench")


def _stored_rows(path: Path) -> int:
    if not path.exists():  # a floor without its store never opens one
        return 0
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])


@pytest.mark.parametrize("without", [frozenset({"engine"}), frozenset({"engine", "store"})])
def test_a_floor_without_parts_answers_and_stores_only_what_it_keeps(tmp_path: Path, without: frozenset[str]) -> None:
    # no producer: the Kafka part is left out too
    app = proxy_floor.FloorApp(None if "engine" in without else "http://127.0.0.1:9", None, "unused",
                               None if "store" in without else tmp_path / "calls.db")
    status, reply = post_asgi(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and reply["object"] == "chat.completion"
    assert _stored_rows(tmp_path / "calls.db") == (0 if "store" in without else 1)


def test_every_part_has_a_variant_without_it_and_one_without_all() -> None:
    assert set(proxy_floor.PARTS) == {"engine", "store", "kafka"}
    variants = adapter_bench.FLOOR_VARIANTS
    assert variants[""] == () and set(variants["server"]) == set(proxy_floor.PARTS)
    assert all(variants[part] == (part,) for part in proxy_floor.PARTS)


# A child with one thread: it reports its own CPU time around 4 ms of work, each step on the parent's word, so the
# parent's clock reads it before and after that work and nothing else runs in it meanwhile.
_BURNER = """
import sys, time
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
started = time.process_time()
while time.process_time() < started + 0.004:
    pass
sys.stdout.write(f"{(time.process_time() - started) * 1000}\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


def _asleep(proc: psutil.Process) -> psutil.Process:
    """`proc` once it is blocked (on its stdin): the kernel adds a running thread's current slice to its total
    only when it is switched out (or at a tick), so a total read while it runs may lack its last few ms."""
    deadline = time.monotonic() + 30
    while proc.status() != psutil.STATUS_SLEEPING:
        assert time.monotonic() < deadline, f"the child never blocked: {proc.status()}"
    return proc


def test_the_cpu_clock_counts_what_a_process_spent_below_a_clock_tick() -> None:
    child = subprocess.Popen([sys.executable, "-c", _BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "ready\n"
        proc = psutil.Process(child.pid)
        before = adapter_bench.process_cpu_ms(_asleep(proc))
        child.stdin.write("go\n")
        child.stdin.flush()
        own_ms = float(child.stdout.readline())  # the 4 ms of work, by the child's own clock
        spent = adapter_bench.process_cpu_ms(_asleep(proc)) - before
    finally:
        child.communicate("done\n", timeout=30)
    # psutil's ticks would read 0 or 10 here; the clock must see the work and little else (two pipe round trips)
    assert own_ms >= 4.0
    assert own_ms <= spent < own_ms + 3.0
