"""Loopback ports for the processes tally starts on one machine (a local cluster, the chaos
run, a ZooKeeper ensemble), chosen below the kernel's ephemeral range.

The kernel takes the local port of every outgoing connection from its ephemeral range
(`net.ipv4.ip_local_port_range`). A port found free there can be taken by a connection
before the process it was chosen for binds it, or while that process is down: a bookie
killed and restarted on its port (its id is its address) would then fail to start.
"""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack
from pathlib import Path

PORTS = range(10_000, 20_000)
"""Where they listen. The test suite's own processes take 20000-32767."""
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
TRIES = 2_000


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports nothing listens on now, below the ephemeral range
    (any free port if none is left there). All are held bound until the last is chosen, so
    that none is handed out twice."""
    span = range(PORTS.start, min(PORTS.stop, _ephemeral_start()))
    with ExitStack() as held:
        ports: list[int] = []
        for port in random.sample(span, min(len(span), TRIES)):
            if len(ports) == count:
                break
            probe = held.enter_context(socket.socket())
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(port)
        while len(ports) < count:
            probe = held.enter_context(socket.socket())
            probe.bind(("127.0.0.1", 0))
            ports.append(int(probe.getsockname()[1]))
        return ports


def free_port() -> int:
    return free_ports(1)[0]


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default
