"""runtime.http.free_port: a port a server can bind later, outside the ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from runtime.http import free_port


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_free_port_is_bindable_and_below_the_ephemeral_range() -> None:
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= port < _ephemeral_low() for port in ports), ports
    assert len(ports) > 1, "the choice is random, not one fixed port"
    port = ports.pop()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_port_skips_a_port_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        taken = busy.getsockname()[1]
        busy.listen()
        # Only the taken port, then bind(0): the taken one is skipped.
        monkeypatch.setattr("random.shuffle", lambda ports: ports.sort(key=lambda p: p != taken))
        port = free_port(attempts=1)
        assert port != taken
