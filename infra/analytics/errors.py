"""Errors of the analytics sink and store."""

from __future__ import annotations

from infra.errors import InfraError


class AnalyticsError(InfraError):
    """Root of `infra.analytics`: the store refused a statement, a table is unknown, a query failed."""


class AnalyticsConfigError(AnalyticsError, ValueError):
    """A setting of the sink or the store is invalid (the message names the field and the value)."""


class StoreLockedError(AnalyticsError):
    """The chdb database folder is held by another process (the running sink)."""


class RowError(AnalyticsError):
    """An event could not be turned into rows (a poison message: the sink dead-letters it)."""
