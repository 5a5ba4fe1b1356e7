"""What `EventConsumer.poll` does with the error events librdkafka hands it among the messages."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

import bus.consumer
from bus.config import BusConfig
from bus.consumer import EventConsumer
from bus.errors import ConsumeError

pytestmark = pytest.mark.unit


class _ErrorEvent:
    def __init__(self, error: KafkaError) -> None:
        self._error = error

    def error(self) -> KafkaError:
        return self._error


def _poll_with(monkeypatch: pytest.MonkeyPatch, error: KafkaError) -> list[Any]:
    consumer = EventConsumer(BusConfig(bootstrap_servers="127.0.0.1:9"), "g", ["llm.calls"], subscribe=False)
    monkeypatch.setattr(bus.consumer, "fetch_ready", lambda *_: [_ErrorEvent(error)])
    try:
        return consumer.poll(0.0)
    finally:
        consumer.close(commit=False)


def test_a_fatal_error_event_stops_the_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    # the code librdkafka gives a fatal error (a fenced static member); the event's own fatal() is False
    fatal = KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by other consumer")
    assert not fatal.fatal()
    with pytest.raises(ConsumeError, match="fenced"):
        _poll_with(monkeypatch, fatal)


def test_a_transient_error_event_is_logged_and_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _poll_with(monkeypatch, KafkaError(KafkaError._TRANSPORT, "broker down")) == []
