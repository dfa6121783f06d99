"""Cookies: a versioned, deterministic serialization, and get / put by CAS / delete."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.errors import (
    BadRequest,
    CookieMismatch,
    KeyExists,
    MalformedData,
    MetadataVersionConflict,
    NoSuchKey,
)
from tally.metadata.cluster import init_cluster
from tally.metadata.cookies import Cookie, CookieManager, VersionedCookie
from tally.metadata.paths import cookie_path
from tests.metadata.conftest import Backend

COOKIE = Cookie("bookie-1:3181", ("/journal", "/ledgers/0", "/ledgers/1"), "instance-1", "inc-1")

names = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40)
cookies = st.builds(
    Cookie,
    names.filter(lambda n: "/" not in n and n not in (".", "..") and n.isprintable()),
    st.lists(names, min_size=1, max_size=4, unique=True).map(tuple),
    names,
    names,
)


@given(cookies)
def test_round_trip_with_equal_bytes_for_equal_cookies(cookie: Cookie) -> None:
    data = cookie.to_bytes()
    decoded = Cookie.from_bytes(data, "the directory /journal")
    assert decoded == cookie
    assert decoded.to_bytes() == data


@settings(max_examples=200)
@given(st.data())
def test_a_flipped_byte_or_a_cut_is_refused_naming_the_source(data: st.DataObject) -> None:
    encoded = bytearray(COOKIE.to_bytes())
    if data.draw(st.booleans()):
        position = data.draw(st.integers(0, len(encoded) - 1))
        encoded[position] ^= data.draw(st.integers(1, 255))
    else:
        del encoded[data.draw(st.integers(0, len(encoded) - 1)) :]
    with pytest.raises(MalformedData, match="/ledgers/0/cookie"):
        Cookie.from_bytes(bytes(encoded), "/ledgers/0/cookie")


def test_each_format_gets_a_new_incarnation() -> None:
    first = Cookie.new("b1", ["/j", "/l"], "instance-1")
    second = Cookie.new("b1", ["/j", "/l"], "instance-1")
    assert first.incarnation_id != second.incarnation_id
    assert (first.bookie_id, first.directories, first.instance_id) == (
        second.bookie_id,
        second.directories,
        second.instance_id,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"bookie_id": "a/b"},
        {"directories": ()},
        {"directories": ["/j"]},
        {"directories": ("/j", "")},
        {"directories": ("/j", "/j")},
        {"instance_id": ""},
        {"incarnation_id": None},
    ],
)
def test_invalid_cookies_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(BadRequest):
        Cookie(**{**vars(COOKIE), **fields})  # type: ignore[arg-type]


def test_a_mismatch_names_every_differing_field() -> None:
    COOKIE.check_matches(Cookie.from_bytes(COOKIE.to_bytes(), "x"), "the store")
    other = Cookie(COOKIE.bookie_id, ("/journal",), "instance-2", COOKIE.incarnation_id)
    with pytest.raises(CookieMismatch) as caught:
        COOKIE.check_matches(other, "the store")
    message = str(caught.value)
    assert "directories" in message
    assert "'instance-1' here, 'instance-2' in the store" in message
    assert "incarnation_id" not in message
    assert "bookie_id" not in message


async def test_get_put_by_version_and_delete(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        cookies = CookieManager(store)
        assert await cookies.get(COOKIE.bookie_id) is None
        assert await cookies.put(COOKIE, None) == 0
        assert await cookies.get(COOKIE.bookie_id) == VersionedCookie(COOKIE, 0)
        with pytest.raises(KeyExists, match="already has a cookie"):
            await cookies.put(COOKIE, None)
        reformatted = Cookie.new(COOKIE.bookie_id, COOKIE.directories, COOKIE.instance_id)
        assert await cookies.put(reformatted, 0) == 1
        with pytest.raises(MetadataVersionConflict):
            await cookies.put(COOKIE, 0)
        assert await cookies.get(COOKIE.bookie_id) == VersionedCookie(reformatted, 1)
        await cookies.put(Cookie.new("b2", ["/d"], "instance-1"), None)
        assert await cookies.bookie_ids() == ["b2", COOKIE.bookie_id]
        with pytest.raises(MetadataVersionConflict):
            await cookies.delete(COOKIE.bookie_id, expected_version=0)
        await cookies.delete(COOKIE.bookie_id, expected_version=1)
        with pytest.raises(NoSuchKey):
            await cookies.delete(COOKIE.bookie_id)
        assert await cookies.bookie_ids() == ["b2"]


async def test_a_stored_cookie_that_is_wrong_says_so(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        await store.create(cookie_path("b1"), COOKIE.to_bytes())
        cookies = CookieManager(store)
        with pytest.raises(CookieMismatch, match=f"bookie {COOKIE.bookie_id}'s, not b1's"):
            await cookies.get("b1")
        await store.set(cookie_path("b1"), b"\x00\x01")
        with pytest.raises(MalformedData, match="cookie /cookies/b1"):
            await cookies.get("b1")
