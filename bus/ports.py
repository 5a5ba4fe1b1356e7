"""Listening ports chosen before the process that listens on them starts (the demo, tests, benches).

The kernel answers `bind(("127.0.0.1", 0))` with a port of its ephemeral range, the range every
outgoing connection's local port is also drawn from. A port chosen that way is free only for the
moment it was chosen: by the time the service binds it (seconds later: a trainer imports torch first),
one of the many Kafka client connections of a running job may hold it as its local port, and a
restarted service then fails to bind it again for as long as that connection lives (seen in CI: the
trainer exited four times in ten seconds). Ports are drawn below the ephemeral range instead, where
the kernel never assigns a local port by itself; only another listener can take one there.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable
from pathlib import Path

from bus.errors import PortError

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # below: ports that well-known local services are configured on
_DEFAULT_EPHEMERAL_LOW = 32_768  # Linux's default when the range cannot be read
_TRIES = 500  # random draws before giving up: a block is free at almost every draw on a test machine


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(offsets: Iterable[int] = (0,)) -> int:
    """A port (with `offsets`: a base port, each base + offset) free now and below the ephemeral range,
    so no outgoing connection takes it before its service binds it."""
    shifts = sorted(set(offsets))
    ceiling = ephemeral_low()
    high = ceiling - shifts[-1]
    if high <= _LOWEST:
        raise PortError(f"no room below the ephemeral range ({ceiling}) for ports at offsets {shifts}")
    for _ in range(_TRIES):
        base = random.randrange(_LOWEST, high)
        if all(bindable(base + o) for o in shifts):
            return base
    raise PortError(f"no free block of ports at offsets {shifts} in [{_LOWEST}, {high}) after {_TRIES} tries")
