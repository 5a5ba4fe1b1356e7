"""Operational events: metric samples and dead letters (messages a consumer could not use).

Topics `metrics`, `dlq` (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from schemas.envelope import Event


@dataclass(frozen=True, kw_only=True)
class MetricSample(Event):
    service: str
    resource_id: str = ""
    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.service


@dataclass(frozen=True, kw_only=True)
class DeadLetter(Event):
    source_topic: str
    source_partition: int
    source_offset: int
    key_bytes: bytes | None = None
    value: bytes | None = None
    reason: str
    consumer_group: str = ""

    AVRO_NAMES: ClassVar[Mapping[str, str]] = {"key_bytes": "key"}  # `key` is the Kafka key property of every event

    @property
    def key(self) -> str:
        return f"{self.source_topic}:{self.source_partition}:{self.source_offset}"
