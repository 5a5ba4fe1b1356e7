"""The scheduler core's one root exception and its refinements.

Every error the core raises is a `SchedulerError`, so the service shell can catch one type at its
boundary; the subclasses say which invariant broke.
"""

from __future__ import annotations


class SchedulerError(Exception):
    """Root of every error raised by scheduler_svc."""


class ConfigError(SchedulerError, ValueError):
    """A policy, setting or simulation parameter has a bad value (the message names field and value)."""


class UnknownResourceError(SchedulerError, KeyError):
    """An observation or query names a resource the pool never saw registered."""


class CapabilityError(SchedulerError):
    """A task was asked of a resource that lacks the capability tag or is offline."""


class ReplayError(SchedulerError):
    """A recorded log does not fit the state it is applied to (wrong order, foreign log, tampering)."""


class LoaderError(SchedulerError):
    """The task dataset is unreadable or inconsistent (duplicate ids, missing id field)."""


class SimulationError(SchedulerError):
    """The cluster simulator reached a state its model does not allow (a bug, not a user error)."""
