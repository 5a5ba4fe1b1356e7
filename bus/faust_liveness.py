"""Broker lost: a Faust worker whose brokers are all gone exits instead of retrying forever.

Faust and aiokafka retry a lost broker without end: a worker left behind by a broker that died
(a test's, a run's) spun at 50-70% CPU until someone killed it. `exit_when_broker_lost` starts a
daemon thread that tries a TCP connection to each bootstrap server every few seconds; when none
accepted one for `timeout_s`, it logs that at critical level and ends the process with status
`EXIT_BROKER_LOST`. The thread does not depend on the event loop, which may be busy or blocked.

The exit is immediate (`os._exit`, like SIGKILL): an app that loses nothing under SIGKILL (its
offsets committed only after its outputs) loses nothing here, and a graceful stop would wait on
the absent broker. A supervisor restarts the worker once the broker is back.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger("sflow.bus.faust")

EXIT_BROKER_LOST: Final = 3


def broker_reachable(bootstrap_servers: str, timeout_s: float = 2.0) -> bool:
    """Whether any of the comma-separated `host:port` servers accepts a TCP connection."""
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            continue
    return False


def _exit_now() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_BROKER_LOST)


def exit_when_broker_lost(bootstrap_servers: str, timeout_s: float,
                          on_lost: Callable[[], None] = _exit_now) -> threading.Thread:
    """Starts the watch (module doc); `on_lost` ends the process (a test may pass its own)."""
    interval = min(5.0, max(0.2, timeout_s / 4))

    def watch() -> None:
        last_seen = time.monotonic()
        while True:
            if broker_reachable(bootstrap_servers, timeout_s=min(2.0, interval)):
                last_seen = time.monotonic()
            elif time.monotonic() - last_seen >= timeout_s:
                log.critical("no broker of %s reachable for %.0f s: exiting with status %d", bootstrap_servers,
                             time.monotonic() - last_seen, EXIT_BROKER_LOST, extra={"service": "faust"})
                on_lost()
                return
            time.sleep(interval)

    thread = threading.Thread(target=watch, name="broker-lost-watch", daemon=True)
    thread.start()
    return thread
