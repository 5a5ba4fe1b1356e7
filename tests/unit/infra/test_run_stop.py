"""Why a run ends: its steps, its time, or a stall (the task stream ran out before max_steps and the run
used to idle until max_minutes)."""

from __future__ import annotations

import pytest

from infra.demo import stop_reason
from infra.monitor import RunState
from infra.run_config import RunSection
from schemas import events as ev
from tests.factories import example

pytestmark = pytest.mark.unit

RUN = RunSection(max_steps=2, max_minutes=10.0, stall_minutes=1.0)
MINUTE = 60_000


def _state(*events: ev.Event) -> RunState:
    state = RunState()
    for e in events:
        state.apply(e)
    return state


def test_calls_and_steps_are_progress_heartbeats_are_not() -> None:
    state = _state(example(ev.LLMCall, ts_ms=5_000), example(ev.TrainStepCompleted, step=1, ts_ms=7_000),
                   example(ev.Heartbeat, ts_ms=9_000))
    assert state.progress_ms == 7_000


def test_a_run_that_keeps_completing_calls_goes_on_until_its_time_is_up() -> None:
    since = 1_000
    busy = _state(example(ev.LLMCall, ts_ms=since + 9 * MINUTE))
    assert stop_reason(busy, RUN, since + 9 * MINUTE + 30_000, since) is None
    assert stop_reason(busy, RUN, since + 10 * MINUTE, since) == "max_minutes"


def test_nothing_completed_for_stall_minutes_ends_the_run() -> None:
    since = 1_000
    idle = _state(example(ev.LLMCall, ts_ms=since + 2 * MINUTE), example(ev.Heartbeat, ts_ms=since + 4 * MINUTE))
    assert stop_reason(idle, RUN, since + 2 * MINUTE + 59_000, since) is None
    assert stop_reason(idle, RUN, since + 3 * MINUTE, since) == "stalled"
    assert stop_reason(RunState(), RUN, since + MINUTE, since) == "stalled"  # counted from the start when silent


def test_done_steps_end_the_run_first() -> None:
    done = _state(*(example(ev.TrainStepCompleted, step=s, ts_ms=s) for s in (1, 2)))
    assert stop_reason(done, RUN, 20 * MINUTE, 0) == "max_steps"
