"""Errors of the `infra` package."""


class InfraError(Exception):
    """Root of the package: the local stack could not be installed, started or stopped."""


class KafkaStartError(InfraError):
    """A broker did not come up (its log file is named in the message)."""
