"""Where the bus is and how its topics are named; shared by every service's config."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from bus.errors import BusError

_PREFIX = re.compile(r"^[A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class BusConfig:
    """Kafka connection settings.

    bootstrap_servers: comma-separated host:port list of brokers.
    topic_prefix: prepended to every catalog topic (several stacks can share one cluster).
    client_id: names this process in broker logs and metrics.
    replication_factor: for topics the admin creates (3 in the three-broker fault mode).
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "sf."
    client_id: str = "sflow"
    replication_factor: int = 1
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or any(":" not in s for s in self.bootstrap_servers.split(",")):
            raise BusError(f"bootstrap_servers must be host:port[,host:port], got {self.bootstrap_servers!r}")
        if not _PREFIX.match(self.topic_prefix):
            raise BusError(f"topic_prefix may hold only letters, digits, '.', '_', '-': {self.topic_prefix!r}")
        if self.replication_factor < 1:
            raise BusError(f"replication_factor must be >= 1, got {self.replication_factor}")

    @classmethod
    def from_env(cls, client_id: str = "sflow") -> BusConfig:
        """Reads SFLOW_BOOTSTRAP, SFLOW_TOPIC_PREFIX and SFLOW_REPLICATION (the stack launcher sets them)."""
        return cls(
            bootstrap_servers=os.environ.get("SFLOW_BOOTSTRAP", cls.bootstrap_servers),
            topic_prefix=os.environ.get("SFLOW_TOPIC_PREFIX", cls.topic_prefix),
            client_id=client_id,
            replication_factor=int(os.environ.get("SFLOW_REPLICATION", "1")),
        )

    def topic(self, name: str) -> str:
        """Full topic name of a catalog topic."""
        return f"{self.topic_prefix}{name}"
