"""`InputGuard.committable_offset`: Faust never commits past an input its agent did not acknowledge.

A real Faust app (never started: no broker); its consumer's ack bookkeeping (`_acked`, `_committed_offset`)
is set as a worker's would be after a seek. Only the consumer's `seek` (which would talk to Kafka) is recorded.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from bus.config import BusConfig
from bus.faust_app import create_faust_app
from bus.faust_recovery import InputGuard

pytestmark = pytest.mark.unit
TOPIC = "t.sessions"


def guard_of(tmp_path: Path) -> tuple[Any, InputGuard, Any]:
    from faust.types import TP

    app = create_faust_app("guard-test", BusConfig(bootstrap_servers="127.0.0.1:9"), tmp_path)
    guard = InputGuard(app, BusConfig(bootstrap_servers="127.0.0.1:9"), "g", [TOPIC], stall_timeout_s=5)
    return app, guard, TP(TOPIC, 2)


def test_faust_alone_commits_past_an_unacknowledged_input_at_the_committed_offset(tmp_path: Path) -> None:
    app, guard, tp = guard_of(tmp_path)
    consumer = app.consumer
    consumer._committed_offset[tp] = 8  # Kafka's committed offset: 8 is the next input to process
    consumer._acked[tp][:] = [9, 10, 11]  # 8 was dropped after a seek; 9-11 processed
    assert guard._faust_new_offset(tp) == 12  # what Faust would commit: input 8 lost


def test_the_guard_holds_the_commit_until_the_next_offset_is_acknowledged(tmp_path: Path) -> None:
    app, _, tp = guard_of(tmp_path)
    consumer = app.consumer
    consumer._committed_offset[tp] = 8
    consumer._acked[tp][:] = [9, 10, 11]
    assert consumer._new_offset(tp) is None
    consumer._acked[tp][:] = [8, 9, 10, 11]
    assert consumer._new_offset(tp) == 12


def test_without_a_commit_the_group_start_is_the_floor(tmp_path: Path) -> None:
    app, guard, tp = guard_of(tmp_path)
    consumer = app.consumer
    guard._start[tp] = 0
    consumer._acked[tp][:] = [1, 2]
    assert consumer._new_offset(tp) is None
    consumer._acked[tp][:] = [0, 1, 2]
    assert consumer._new_offset(tp) == 3


def test_unguarded_topics_keep_fausts_rule(tmp_path: Path) -> None:
    from faust.types import TP

    app, _, _ = guard_of(tmp_path)
    ticks = TP("t.ticks", 0)
    app.consumer._committed_offset[ticks] = 8
    app.consumer._acked[ticks][:] = [9]
    assert app.consumer._new_offset(ticks) == 10


def test_a_held_offset_is_read_again_after_the_stall_timeout(tmp_path: Path) -> None:
    app, guard, tp = guard_of(tmp_path)
    consumer = app.consumer
    sought: list[tuple[Any, int]] = []

    async def seek(partition: Any, offset: int) -> None:
        sought.append((partition, offset))

    consumer.seek = seek
    consumer._committed_offset[tp] = 8
    consumer._acked[tp][:] = [9, 10]
    assert consumer._new_offset(tp) is None
    now = time.monotonic()
    asyncio.run(guard._reread_held([tp], now + 1))
    assert sought == []  # not yet: within stall_timeout_s
    asyncio.run(guard._reread_held([tp], now + 6))
    assert sought == [(tp, 8)]


def test_inputs_are_admitted_in_offset_order_and_a_hole_is_read_again(tmp_path: Path) -> None:
    from faust.types import TP

    app, guard, tp = guard_of(tmp_path)
    sought: list[int] = []

    async def seek(partition: Any, offset: int) -> None:
        sought.append(offset)

    app.consumer.seek = seek

    def message(offset: int) -> Any:
        return type("M", (), {"topic": TOPIC, "partition": 2, "offset": offset, "tp": tp})()

    async def scenario() -> list[str]:
        guard._expected[(TOPIC, 2)] = 5  # where the group resumed it
        verdicts = [guard._admit(message(o)) for o in (5, 7, 8)]  # 6 was overtaken after a seek
        await asyncio.sleep(0)  # the seek back runs
        verdicts += [guard._admit(message(o)) for o in (5, 6, 7, 8)]  # read again from 6 (and an old 5)
        verdicts.append(guard._admit(type("M", (), {"topic": "t.ticks", "partition": 0, "offset": 99,
                                                    "tp": TP("t.ticks", 0)})()))  # unguarded: always next
        return verdicts

    verdicts = asyncio.run(scenario())
    assert verdicts == ["next", "ahead", "ahead", "read again", "next", "next", "next", "next"]
    assert sought == [6]  # one seek back for the hole, not one per message that overtook it


def test_the_read_offset_stays_at_a_hole_until_faust_reads_it_again(tmp_path: Path) -> None:
    from faust.types import TP

    app, guard, tp = guard_of(tmp_path)
    read = app.consumer._read_offset
    assert read[TP(TOPIC, 0)] is None  # Faust's default for a partition never read
    read[tp] = 6  # what Faust's seek writes
    guard._holes[tp] = 6
    read[tp] = 9  # a message fetched before the seek
    assert read[tp] == 6  # Faust still accepts 6 when it is fetched again (it accepts offsets >= this)
    read[tp] = 6  # Faust read the hole
    assert tp not in guard._holes
    read[tp] = 7
    assert read[tp] == 7
