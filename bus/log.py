"""Structured logs: one `key=value` line per record, with the service and whatever context the
call site passes (`log.info("loaded", extra={"resource": r, "version": v})`)."""

from __future__ import annotations

import logging
import sys
from typing import Final

# librdkafka's own messages go through Python logging (level-filtered) instead of raw stderr lines.
RDKAFKA_LOG: Final = logging.getLogger("sflow.bus.librdkafka")

_STANDARD: Final = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        ts = self.formatTime(record, "%H:%M:%S")
        parts = [f"{ts}.{int(record.msecs):03d}", record.levelname.lower(), f"service={self.service}"]
        parts += [f"{k}={v}" for k, v in fields.items()]
        parts.append(f"msg={record.getMessage()!r}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(service: str, level: str = "INFO") -> None:
    """Routes every logger of the process to stderr in key=value form, tagged with the service."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
