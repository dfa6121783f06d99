from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.addresses import join_host_port, split_host_port
from tally.core.errors import BadRequest


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:3181", ("127.0.0.1", 3181)),
        ("bookie-1.example:65535", ("bookie-1.example", 65535)),
        ("[::1]:3181", ("::1", 3181)),
        ("[fe80::1%eth0]:1", ("fe80::1%eth0", 1)),
    ],
)
def test_host_and_port(address: str, expected: tuple[str, int]) -> None:
    assert split_host_port(address) == expected


@pytest.mark.parametrize(
    "address", ["localhost", ":3181", "host:", "host:http", "host:65536", "host:-1", "host:0"]
)
def test_what_is_not_host_port_is_refused(address: str) -> None:
    with pytest.raises(BadRequest, match="not host:port"):
        split_host_port(address)


def test_a_listen_address_may_ask_for_any_port() -> None:
    assert split_host_port("0.0.0.0:0", port_zero=True) == ("0.0.0.0", 0)


@given(
    st.one_of(st.ip_addresses().map(str), st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True)),
    st.integers(1, 65535),
)
def test_join_and_split_round_trip(host: str, port: int) -> None:
    assert split_host_port(join_host_port(host, port)) == (host, port)
