"""Configuration of `sflow dashboard`: where it listens, how often the page refreshes, which store it reads.

Validated at start-up (a strict `bus.kit.ConfigModel`): a bad value raises `DashboardConfigError` naming the
field and the value. The store is an `AnalyticsConfig`, chosen like `sflow analytics --run` does.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from bus.kit import ConfigModel
from infra.analytics.config import AnalyticsConfig
from infra.dashboard.errors import DashboardConfigError


class DashboardConfig(ConfigModel):
    """What the dashboard server needs."""

    config_error: ClassVar[type[Exception]] = DashboardConfigError

    store: AnalyticsConfig = Field(description="The analytics store the panels read (read-only).")
    title: str = Field(default="SeamlessFlow run", min_length=1, description="The page's heading: the run's name.")
    host: str = Field(default="127.0.0.1", min_length=1, description="Address the HTTP server binds.")
    port: int = Field(default=8765, ge=0, le=65535, description="HTTP port (0: any free port).")
    refresh_s: float = Field(
        default=3.0, ge=0.2, le=3600,
        description="How often the page asks for new panel data: a live run's store gains rows as it runs.",
    )
    trajectory_limit: int = Field(
        default=200, ge=1, le=100_000, description="Newest trajectories listed in the session view's picker."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="warning", description="Server log level.")
