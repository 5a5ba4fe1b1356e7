"""Errors of the live dashboard."""

from __future__ import annotations

from infra.errors import InfraError


class DashboardError(InfraError):
    """Root of `infra.dashboard`."""


class DashboardConfigError(DashboardError, ValueError):
    """A dashboard setting is invalid (the message names the field and the value)."""
