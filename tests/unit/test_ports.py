"""Ports for the processes tally starts: distinct, free, and out of the kernel's reach."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import tally.ports
from tally.ports import PORTS, free_ports


def ephemeral_start() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(PORTS.start <= port < min(PORTS.stop, ephemeral_start()) for port in ports)
    for port in ports:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))


def test_a_port_that_is_taken_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    (port,) = free_ports(1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        monkeypatch.setattr(tally.ports, "PORTS", range(port, port + 1))
        (given,) = free_ports(1)  # none left below the range: any free one, not this one
        assert given != port
