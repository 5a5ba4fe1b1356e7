"""The job's phase times: the Makefile's setup phases read from the environment, the job's own timed."""

from __future__ import annotations

import pytest

from infra.errors import InfraError
from infra.phases import SETUP_PHASES_VAR, PhaseClock, setup_phases

pytestmark = pytest.mark.unit


def test_setup_phases_are_read_in_order_and_absent_when_not_set() -> None:
    assert setup_phases({SETUP_PHASES_VAR: "install=12.5, jars=0.25"}) == {"install": 12.5, "jars": 0.25}
    assert list(setup_phases({SETUP_PHASES_VAR: "jars=1,install=2"})) == ["jars", "install"]
    assert setup_phases({}) == {} and setup_phases({SETUP_PHASES_VAR: ""}) == {}


@pytest.mark.parametrize("bad", ["install", "install=soon", "=3", "jars=-1"])
def test_a_malformed_setup_phase_is_refused_naming_the_variable(bad: str) -> None:
    with pytest.raises(InfraError, match=SETUP_PHASES_VAR):
        setup_phases({SETUP_PHASES_VAR: bad})


def test_the_clock_adds_up_a_phase_entered_twice_and_keeps_the_first_order() -> None:
    clock = PhaseClock({"install": 3.0})
    for name in ("kafka", "model", "kafka"):
        with clock.phase(name):
            pass
    assert list(clock.seconds) == ["install", "kafka", "model"]
    assert clock.total >= 3.0 and all(s >= 0 for s in clock.seconds.values())
    with pytest.raises(RuntimeError), clock.phase("failing"):
        raise RuntimeError("the phase's error passes through")
    assert "failing" in clock.seconds
