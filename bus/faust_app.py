"""Faust app factory with the project's Avro codec, so Faust agents receive typed events.

Register once (`register_codec`), then `app.topic(name, value_serializer=CODEC)` yields `Event`
dataclasses. A message that cannot be decoded does not crash the agent: the codec returns an
`Undecodable` marker and `typed_events` sends it to the dead-letter topic and goes on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bus.config import BusConfig
from bus.deadletter import dead_letter
from bus.producer import EventProducer
from schemas.errors import SchemaError
from schemas.events import Event, decode_event, encode_event

log = logging.getLogger("sflow.bus")

CODEC: Final = "sflow-avro"


@dataclass(frozen=True)
class Undecodable:
    """What the codec yields for bytes that are not a valid event."""

    raw: bytes
    reason: str


def register_codec() -> None:
    """Makes `value_serializer="sflow-avro"` available to Faust topics (idempotent)."""
    from faust.serializers import codecs

    class AvroEventCodec(codecs.Codec):
        def _dumps(self, obj: Any) -> bytes:
            if isinstance(obj, (bytes, bytearray)):
                return bytes(obj)
            return encode_event(obj)

        def _loads(self, s: bytes) -> Any:
            try:
                return decode_event(s)
            except SchemaError as e:
                return Undecodable(bytes(s), str(e))

    codecs.register(CODEC, AvroEventCodec())


def create_faust_app(
    app_id: str,
    config: BusConfig,
    data_dir: Path,
    **settings: Any,
) -> Any:
    """A Faust app on the configured brokers with RocksDB tables under `data_dir`."""
    import faust

    register_codec()
    broker = ";".join(f"kafka://{s}" for s in config.bootstrap_servers.split(","))
    defaults: dict[str, Any] = {
        "broker": broker,
        "store": "rocksdb://",
        "datadir": str(data_dir),
        "topic_replication_factor": config.replication_factor,
        "topic_partitions": 4,
        "producer_acks": -1,
        "consumer_auto_offset_reset": "earliest",
        "web_enabled": False,
        "producer_max_request_size": 32 * 1024 * 1024,
        "consumer_max_fetch_size": 64 * 1024 * 1024,
    }
    defaults.update(settings)
    return faust.App(f"{config.topic_prefix}{app_id}", **defaults)


async def typed_events(fevents: AsyncIterable[Any], dlq: EventProducer, config: BusConfig,
                       group: str) -> AsyncIterator[tuple[Any, Event]]:
    """(message, event) for each Faust event of `fevents` (`stream.events()`, or a guard's admitted events);
    undecodable messages go to the DLQ with their coordinates."""
    async for fevent in fevents:
        value = fevent.value
        if isinstance(value, Undecodable):
            msg = fevent.message
            letter = dead_letter(msg.topic, msg.partition, msg.offset, key=msg.key, value=value.raw,
                                 reason=f"undecodable: {value.reason}", consumer_group=group)
            await dlq.publish_async(letter, topic=config.topic("dlq"))
            log.warning("dead-lettered %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset, value.reason)
            continue
        yield fevent.message, value
