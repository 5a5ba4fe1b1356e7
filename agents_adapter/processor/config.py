"""Settings of the trajectory processor, validated at construction (errors name the field and the value).

`ProcessorConfig.from_args(argv)` is the worker's command line: one `--field-name` flag per field
(`bus.kit`), the bus from `--bootstrap-servers` / `--topic-prefix` or the environment (SFLOW_BOOTSTRAP,
SFLOW_TOPIC_PREFIX, SFLOW_REPLICATION).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Final, Literal

from pydantic import Field, field_validator, model_validator

from agents_adapter.errors import ConfigError
from agents_adapter.processor.assembler import AssemblerConfig
from bus.config import BusConfig
from bus.errors import BusError
from bus.kit import (
    ConfigModel,
    MetricsHost,
    MetricsPort,
    add_bus_flags,
    add_config_flags,
    build_or_exit,
    config_values,
    pop_bus_settings,
)
from bus.topics import spec

LEVELS: Final = ("debug", "info", "warning", "error", "critical")


class ProcessorConfig(ConfigModel):
    """The processor's settings; the Faust shell's module doc (`faust_shell`) says what each guards."""

    config_error: ClassVar[type[Exception]] = ConfigError

    bus: BusConfig = Field(default_factory=BusConfig)
    """Where Kafka is and the topic prefix."""
    app_id: str = "trajectory-processor"
    """Faust app id below the topic prefix: the consumer group, and the prefix of the processor's internal
    topics (`<app>-ticks`, `<app>-groups`, the table changelogs)."""
    data_dir: Path = Path("data/trajectory-processor")
    """Where Faust keeps its RocksDB tables: a cache of the changelogs for one run of the worker, deleted
    at start ("The changelog is the state")."""
    producer: str = "trajectory-processor"
    """The `producer` field of Trajectory and BatchReady events; part of their bytes, so a replay that
    compares bytes must use the same value."""
    ttl_ms: int = Field(default=30 * 60_000, ge=1)
    """A session with no input for this long is closed with status timeout."""
    tick_interval_s: float = Field(default=5.0, gt=0, le=3600)
    """How often the TTL timer ticks (a timeout fires at most this late)."""
    closed_retention_ms: int = 3_600_000
    """How long a closed session's tombstone (and a fired group's marker) drops late inputs; must cover the
    longest redelivery after a restart."""
    group_size: int | None = None
    """Samples per task group when neither TaskDispatched nor the session metadata says (none: such groups
    never produce BatchReady)."""
    group_size_key: str = "n_samples"
    """SessionStarted metadata key holding the group size."""
    wait_for_calls: bool = True
    """Keep a session open until SessionEnded.num_calls calls arrived (or the TTL)."""
    commit_interval_s: float = Field(default=2.8, gt=0, le=600)
    """Faust's offset commit interval (how much a killed worker re-reads)."""
    stall_timeout_s: float = Field(default=15.0, ge=1, le=3600)
    """An input partition with unread messages and no progress for this long is sought back to its next
    unprocessed offset ("Stalled partitions" in `bus.faust_recovery`)."""
    session_timeout_s: float = Field(default=30.0, ge=6, le=300)
    """Kafka consumer session timeout (how long a killed worker holds its partitions before the group
    rebalances them; the broker's limits are 6 s to 300 s)."""
    group_instance_id: str | None = None
    """Static group membership (Kafka's group.instance.id): a worker restarted with the same id takes its
    partitions back at once, where a dynamic member waits out the dead one's `session_timeout_s` (the job
    stalls that long after a crash). Unique among the running workers of the group; None: dynamic."""
    broker_lost_timeout_s: float = Field(default=60.0, ge=1, le=3600)
    """With no broker of `bus` reachable for this long the worker logs it and exits with status 3 (its
    supervisor restarts it) instead of retrying forever ("Broker lost" in `bus.faust_liveness`)."""
    processing_guarantee: Literal["at_least_once"] = "at_least_once"
    """"at_least_once" only: effectively once with consumer dedupe (the `faust_shell` module doc says why
    Faust's "exactly_once" is refused)."""
    log_level: str = "warning"
    """The worker's log level (debug, info, warning, error, critical)."""
    metrics_port: MetricsPort = None
    """Serve the Prometheus series (`bus.metrics`: trajectories, batches, consumer lag, dead letters) on this
    port (None: no metrics)."""
    metrics_host: MetricsHost = "127.0.0.1"
    """Address the metrics port listens on."""

    @field_validator("app_id")
    @classmethod
    def _app_id_is_a_topic_name(cls, value: str) -> str:
        if not value or not all(c.isalnum() or c in "._-" for c in value):
            raise ValueError(f"app_id={value!r}: must be letters, digits, '.', '_' or '-'")
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in LEVELS:
            raise ValueError(f"log_level={value!r}: must be one of {LEVELS}")
        return value

    @model_validator(mode="after")
    def _valid_assembler(self) -> ProcessorConfig:
        self.assembler_config()  # validates producer, group_size, group_size_key, closed_retention_ms
        return self

    def assembler_config(self) -> AssemblerConfig:
        """The core's settings: groups are counted by stage 2, not by the per-partition assemblers."""
        return AssemblerConfig(
            producer=self.producer,
            group_size=self.group_size,
            group_size_key=self.group_size_key,
            closed_retention_ms=self.closed_retention_ms,
            wait_for_calls=self.wait_for_calls,
            track_groups=False,
        )

    @property
    def partitions(self) -> int:
        """Partitions of the session-keyed inputs (from the topic catalog); every internal topic has as many."""
        calls, sessions = spec("llm.calls").partitions, spec("sessions").partitions
        if calls != sessions:
            raise ConfigError(f"llm.calls has {calls} partitions and sessions {sessions}: they must be co-partitioned")
        return calls

    @property
    def ticks_topic(self) -> str:
        return f"{self.app_id}-ticks"

    @property
    def groups_topic(self) -> str:
        return f"{self.app_id}-groups"

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> ProcessorConfig:
        """The worker's command line (a bad value exits with status 2, naming the field and the value)."""
        parser = argparse.ArgumentParser(prog="python -m agents_adapter.processor",
                                         description="SeamlessFlow trajectory processor (Faust worker)")
        add_config_flags(parser, cls, skip=("bus",))
        add_bus_flags(parser)
        values = vars(parser.parse_args(argv))

        def build() -> ProcessorConfig:
            typed = config_values(cls, values)
            bus = pop_bus_settings(typed, client_id=typed.get("app_id", cls.model_fields["app_id"].default))
            return cls(bus=bus, **typed)

        return build_or_exit(parser, build, (ConfigError, BusError, ValueError))
