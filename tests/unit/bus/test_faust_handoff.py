"""`BufferHandoff`: a handler's changelog writes count as safe only once Faust's buffer handed them to the client.

The buffer is Faust's real `ProducerBuffer` (the app is never started: no broker); the message's channel is the
edge that would talk to Kafka, replaced by one whose hand-off the test holds open.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bus.config import BusConfig
from bus.errors import BusError
from bus.faust_app import create_faust_app
from bus.faust_recovery import BufferHandoff

pytestmark = pytest.mark.unit


class HeldChannel:
    """A channel whose publish_message waits until the test releases it (a slow hand-off to the client)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.published: list[Any] = []

    async def publish_message(self, fut: Any, wait: bool = False) -> None:
        await self.release.wait()
        self.published.append(fut)


def app_and_handoff(tmp_path: Path) -> tuple[Any, BufferHandoff]:
    app = create_faust_app("handoff-test", BusConfig(bootstrap_servers="127.0.0.1:9"), tmp_path)
    return app, BufferHandoff(app)


def test_wait_handed_waits_for_a_write_taken_off_the_queue_but_not_yet_in_the_client(tmp_path: Path) -> None:
    async def scenario() -> None:
        app, handoff = app_and_handoff(tmp_path)
        buffer, channel = app.producer.buffer, HeldChannel()
        fut = SimpleNamespace(message=SimpleNamespace(channel=channel))
        buffer.put(fut)
        taken = buffer.pending.get_nowait()  # what the buffer's sender does first: the queue is now empty
        sending = asyncio.ensure_future(buffer._send_pending(taken))
        waiting = asyncio.ensure_future(handoff.wait_handed(timeout_s=5))
        await asyncio.sleep(0.05)
        assert buffer.size == 0 and handoff.in_flight == 1
        assert not waiting.done()  # an empty queue is not enough
        channel.release.set()
        await asyncio.wait_for(waiting, 5)
        await sending
        assert channel.published == [fut] and handoff.in_flight == 0

    asyncio.run(scenario())


def test_wait_handed_returns_at_once_when_nothing_is_in_flight_and_times_out_on_a_stuck_send(tmp_path: Path) -> None:
    async def scenario() -> None:
        app, handoff = app_and_handoff(tmp_path)
        await asyncio.wait_for(handoff.wait_handed(timeout_s=1), 1)
        app.producer.buffer.put(SimpleNamespace(message=SimpleNamespace(channel=HeldChannel())))
        with pytest.raises(BusError, match="1 changelog writes not handed to Kafka"):
            await handoff.wait_handed(timeout_s=0.2)

    asyncio.run(scenario())
