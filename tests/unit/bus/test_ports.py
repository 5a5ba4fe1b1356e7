"""Ports handed to services before they start: free, and outside the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from bus import ports
from bus.errors import PortError

pytestmark = pytest.mark.unit


def test_a_free_port_is_bindable_and_below_the_ephemeral_range() -> None:
    for _ in range(20):
        port = ports.free_port()
        assert 10_000 <= port < ports.ephemeral_low()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_block_has_every_offset_free() -> None:
    base = ports.free_port(offsets=[0, 1, 2, 100, 101, 102])
    assert base + 102 < ports.ephemeral_low()
    assert all(ports.bindable(base + o) for o in (0, 1, 2, 100, 101, 102))


def test_a_port_held_by_a_listener_is_not_bindable() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.free_port()))
        held.listen()
        assert not ports.bindable(held.getsockname()[1])


def test_the_ephemeral_range_is_read_from_the_kernel_and_a_full_range_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "ip_local_port_range"
    fake.write_text("10050\t60999\n")
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", fake)
    assert ports.ephemeral_low() == 10050
    with pytest.raises(PortError, match="offsets \\[0, 100\\]"):
        ports.free_port(offsets=[0, 100])
    fake.write_text("garbage")
    assert ports.ephemeral_low() == 32768
