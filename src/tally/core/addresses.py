"""host:port, as bookie ids and listen addresses are written ("[v6 address]:port" too)."""

from __future__ import annotations

from tally.core.errors import BadRequest


def split_host_port(address: str, *, port_zero: bool = False) -> tuple[str, int]:
    """(host, port) of "host:port" or "[v6 address]:port"; `port_zero` lets a listen
    address ask for any free port."""
    if not isinstance(address, str):
        raise BadRequest(f"an address is a str (host:port), not {type(address).__name__}")
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    lowest = 0 if port_zero else 1
    if not host or not port.isdecimal() or not lowest <= int(port) < 65536:
        raise BadRequest(f"address {address!r} is not host:port with a port in {lowest}..65535")
    return host, int(port)


def join_host_port(host: str, port: int) -> str:
    """The address of `host` and `port`, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
