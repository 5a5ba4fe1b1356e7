"""The demo's supervision: an exited service is started again, a bounded number of times."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest

from infra.demo import restart_exited
from infra.errors import InfraError

pytestmark = pytest.mark.unit


class Exited:
    """What supervision reads of a service's last process: its status and its log."""

    returncode = 1
    log = "logs/scheduler.log"

    def tail(self, lines: int) -> str:
        return "OSError: [Errno 98] Address already in use"


class Services:
    """Launcher's surface that supervision uses, over a set of names marked alive or not."""

    def __init__(self, *names: str) -> None:
        self.specs = dict.fromkeys(names)
        self.alive = set(names)
        self.procs = {name: Exited() for name in names}
        self.restarted: list[str] = []

    def running(self) -> list[str]:
        return sorted(self.alive)

    def restart(self, name: str) -> None:
        self.restarted.append(name)
        self.alive.add(name)


def test_an_exited_service_is_restarted_until_its_budget_is_spent() -> None:
    services, restarts = Services("scheduler", "trainer"), Counter[str]()
    launcher = cast(Any, services)
    restart_exited(launcher, restarts, max_restarts=2)
    assert services.restarted == []
    for _ in range(2):
        services.alive.discard("scheduler")
        restart_exited(launcher, restarts, max_restarts=2)
    assert services.restarted == ["scheduler", "scheduler"] and restarts == {"scheduler": 2}
    services.alive.discard("scheduler")
    with pytest.raises(InfraError, match="service scheduler exited 3 times, last with status 1") as failed:
        restart_exited(launcher, restarts, max_restarts=2)
    assert "Address already in use" in str(failed.value), "the message carries the log's tail (CI keeps no run dir)"
