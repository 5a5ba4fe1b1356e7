"""The broker-lost watch of Faust workers (`bus.faust_liveness`), against real sockets."""

from __future__ import annotations

import socket
import threading

import pytest

from bus.faust_liveness import broker_reachable, exit_when_broker_lost

pytestmark = pytest.mark.unit


def test_the_watch_fires_once_no_server_accepts_and_not_while_one_does() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        assert broker_reachable(f"127.0.0.1:1,127.0.0.1:{port}")
        lost = threading.Event()
        watch = exit_when_broker_lost(f"127.0.0.1:{port}", timeout_s=1.0, on_lost=lost.set)
        assert not lost.wait(1.5)  # a server accepts: nothing happens
    assert not broker_reachable(f"127.0.0.1:{port}")
    assert lost.wait(10)  # gone for timeout_s: the watch ends the process (here: sets the event)
    watch.join(5)
    assert not watch.is_alive()
