"""Errors of the `bus` package; confluent-kafka and Faust errors are converted at this boundary."""


class BusError(Exception):
    """Root of the package."""


class PublishError(BusError):
    """Kafka did not acknowledge an event: the caller must treat it as not recorded."""


class ConsumeError(BusError):
    """The consumer failed in a way it cannot skip (not a bad message: those go to the DLQ)."""


class TopicError(BusError):
    """A topic could not be created or does not exist."""


class ProcessError(BusError):
    """A managed service process exited, or was not ready, when it had to be (the message has its log's tail)."""


class PortError(BusError):
    """No free listening port (or block of ports) below the kernel's ephemeral range."""
