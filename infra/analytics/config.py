"""Configuration of the analytics sink (`python -m infra.analytics`) and of the store the CLI reads.

Validated at start-up (a strict `bus.kit.ConfigModel`, like every service's config): a bad value raises
`AnalyticsConfigError` naming the field and the offending input (`pydantic.ValidationError` from
`model_validate`). Unset connection fields fall back to the environment the stack launcher sets
(`SFLOW_BOOTSTRAP`, `SFLOW_TOPIC_PREFIX`, `SFLOW_CLICKHOUSE_URL`, `SFLOW_ANALYTICS_DIR`), then to the
local stack's defaults.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from bus.config import BusConfig
from bus.kit import ConfigModel
from bus.topics import CATALOG
from infra.analytics.errors import AnalyticsConfigError, AnalyticsError
from infra.analytics.store import AnalyticsStore, ChdbStore, ClickHouseServerStore, held_by_another_process, redact

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GROUP = re.compile(r"^[A-Za-z0-9._-]+$")
ALL_TOPICS: tuple[str, ...] = tuple(t.name for t in CATALOG)


def _default_data_dir() -> Path:
    from infra.stack import VAR_DIR

    return Path(os.environ.get("SFLOW_ANALYTICS_DIR", VAR_DIR / "analytics"))


class AnalyticsConfig(ConfigModel):
    """What the analytics sink needs: where the bus is, what to read, where rows go, how often to flush."""

    config_error: ClassVar[type[Exception]] = AnalyticsConfigError

    bootstrap_servers: str | None = Field(
        default=None,
        description="Kafka brokers host:port[,host:port]; None = SFLOW_BOOTSTRAP, else the running local stack.",
    )
    topic_prefix: str | None = Field(
        default=None, description="Catalog topic prefix; None = SFLOW_TOPIC_PREFIX, else 'sf.'."
    )
    group_id: str = Field(
        default="sflow-analytics", min_length=1,
        description="Kafka consumer group; its committed offsets trail the rows stored in ClickHouse. Use one "
        "group per topic prefix: a static member (group_instance_id) that rejoins its group with other topics "
        "is handed its previous assignment back and reads nothing.",
    )
    group_instance_id: str | None = Field(
        default="sflow-analytics-0",
        description="Static group membership id: a restarted sink takes its partitions back at once instead "
        "of waiting out the dead member's session timeout. None = dynamic membership.",
    )
    session_timeout_ms: int = Field(
        default=10_000, ge=6_000, le=300_000,
        description="Kafka consumer session timeout: how long a silent (crashed) sink keeps its partitions.",
    )
    topics: tuple[str, ...] = Field(default=ALL_TOPICS, description="Catalog topics to store (default: all).")
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Run folder of the chdb backend; the database lives in data_dir/chdb. "
        "Default: SFLOW_ANALYTICS_DIR, else var/analytics.",
    )
    clickhouse_url: str | None = Field(
        default_factory=lambda: os.environ.get("SFLOW_CLICKHOUSE_URL") or None,
        description="http[s]://[user[:password]@]host[:port] of a ClickHouse server; set = use it instead of "
        "chdb. Default: SFLOW_CLICKHOUSE_URL.",
    )
    database: str = Field(default="sflow", description="ClickHouse database holding the analytics tables.")
    batch_max_events: int = Field(
        default=5_000, ge=1, le=1_000_000,
        description="Flush (insert, record offsets, commit) once this many events are buffered.",
    )
    flush_interval_s: float = Field(
        default=1.0, gt=0, le=3600, description="Flush at least this often while events are buffered."
    )
    poll_timeout_s: float = Field(default=0.5, gt=0, le=60, description="Longest wait for events in one poll.")
    idle_exit_s: float = Field(
        default=0.0, ge=0,
        description="Exit after this many seconds without events, everything flushed (0 = run until signalled); "
        "for backfills and tests.",
    )
    fsync_inserts: bool = Field(
        default=False,
        description="Create tables with fsync_after_insert: rows survive a machine crash, not only a process "
        "crash, before offsets are committed (slower inserts). Applies to tables this run creates.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level.")

    @field_validator("topics")
    @classmethod
    def _catalog_topics(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [t for t in value if t not in ALL_TOPICS]
        if unknown or not value:
            raise ValueError(f"topics={list(value)!r}: each must be one of {list(ALL_TOPICS)}")
        return value

    @field_validator("group_id")
    @classmethod
    def _group_name(cls, value: str) -> str:
        if not _GROUP.match(value):
            raise ValueError(f"group_id={value!r} may hold only letters, digits, '.', '_', '-'")
        return value

    @field_validator("database")
    @classmethod
    def _plain_database(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError(f"database={value!r} must match [A-Za-z_][A-Za-z0-9_]*")
        return value

    @field_validator("clickhouse_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"clickhouse_url={redact(value)!r}: expected http[s]://host[:port]")
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_ports(cls, value: str | None) -> str | None:
        if value is not None and any(":" not in s for s in value.split(",")):
            raise ValueError(f"bootstrap_servers={value!r}: expected host:port[,host:port]")
        return value

    @property
    def chdb_path(self) -> Path:
        return self.data_dir / "chdb"

    @property
    def backend(self) -> Literal["chdb", "server"]:
        return "server" if self.clickhouse_url else "chdb"

    def bus_config(self) -> BusConfig:
        """The bus this sink reads: explicit fields first, then the environment / local stack."""
        from infra import stack

        base = (
            BusConfig(bootstrap_servers=self.bootstrap_servers, client_id=self.group_id)
            if self.bootstrap_servers
            else stack.bus_config(self.group_id)
        )
        prefix = self.topic_prefix if self.topic_prefix is not None else os.environ.get(
            "SFLOW_TOPIC_PREFIX", base.topic_prefix)
        return BusConfig(
            bootstrap_servers=base.bootstrap_servers, topic_prefix=prefix, client_id=self.group_id,
            replication_factor=base.replication_factor, extra=dict(base.extra),
        )


def open_store(config: AnalyticsConfig, read_only: bool = False) -> AnalyticsStore:
    """The configured store. `read_only` (the CLI): never creates tables, and reads a snapshot of a chdb
    folder that a running sink holds."""
    if config.clickhouse_url:
        return ClickHouseServerStore(config.clickhouse_url, config.database, config.fsync_inserts,
                                     create=not read_only)
    if not read_only:
        return ChdbStore(config.chdb_path, config.database, config.fsync_inserts)
    if not config.chdb_path.is_dir():
        raise AnalyticsError(f"no analytics data at {config.chdb_path}: run the sink (python -m infra.analytics)")
    if not held_by_another_process(config.chdb_path):  # asked first: a refused open makes chdb print an error
        try:
            return ChdbStore(config.chdb_path, config.database, create=False)
        except AnalyticsError:  # taken between the check and the open: refused as locked (StoreLockedError), or
            pass  # as a plain AnalyticsError when let go again before the refusal was told from a lock
    return ChdbStore.snapshot(config.chdb_path, config.database)
