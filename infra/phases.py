"""Where a job's wall time went, phase by phase: the end of `make demo` prints it and `summary.json` keeps it.

The phases before the job's own process (the venv's install, Kafka's jars) are timed by the Makefile and
handed over in `SFLOW_SETUP_PHASES` ("install=12.3,jars=0.4", seconds).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from infra.errors import InfraError

SETUP_PHASES_VAR = "SFLOW_SETUP_PHASES"


@dataclass
class PhaseClock:
    """Seconds per phase, in the order the phases first ran."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - start

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def setup_phases(env: Mapping[str, str]) -> dict[str, float]:
    """The phases the Makefile timed (none when the job was started otherwise, e.g. by `sflow train`)."""
    text = env.get(SETUP_PHASES_VAR, "").strip()
    phases: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        try:
            phases[name.strip()] = float(value)
        except ValueError as e:
            raise InfraError(f"{SETUP_PHASES_VAR}={text!r}: {item!r} is not NAME=SECONDS") from e
        if not name.strip() or phases[name.strip()] < 0:
            raise InfraError(f"{SETUP_PHASES_VAR}={text!r}: {item!r} is not NAME=SECONDS")
    return phases
