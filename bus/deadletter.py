"""The one way a consumer records a message it cannot process: a `DeadLetter` with where it came from.

Its `correlation_id` (`topic:partition:offset`) makes a re-sent letter recognisable; key and value are
kept as bytes only (a Faust message may carry decoded objects, which the letter cannot hold).
"""

from __future__ import annotations

from typing import Any

from schemas.events import DeadLetter


def _bytes_or_none(value: Any) -> bytes | None:
    return value if isinstance(value, bytes) else None


def dead_letter(topic: str, partition: int, offset: int, *, key: Any, value: Any, reason: str,
                consumer_group: str, producer: str = "") -> DeadLetter:
    """The letter of message `topic[partition]@offset`; `producer` names the writer (empty: the bus fills
    in the producer's id)."""
    return DeadLetter(
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        key_bytes=_bytes_or_none(key),
        value=_bytes_or_none(value),
        reason=reason,
        consumer_group=consumer_group,
        correlation_id=f"{topic}:{partition}:{offset}",
        producer=producer,
    )
