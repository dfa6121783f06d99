"""Cookies: a bookie's proof that its disks and its identity in the cluster belong together.

When a bookie is formatted it writes the same cookie to the store and to each of its
directories; at every start the copies must agree. A disk swapped in from elsewhere, a
directory missing, a bookie pointed at another cluster, or a store that was nuked and
re-initialised (a new instance id) all show up as a mismatch instead of as silently
missing entries. The incarnation id is new at each format, so the auditor can tell a
bookie that lost its data and came back empty from the one it used to be (BP-31).

`Cookie.to_bytes()` is deterministic (sorted JSON): the bytes written to each directory
are the bytes stored, and equal cookies are equal bytes.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tally.core.errors import BadRequest, CookieMismatch, KeyExists, MalformedData, NoSuchKey
from tally.metadata import json_records
from tally.metadata.key_ops import Watcher
from tally.metadata.paths import COOKIES, check_bookie_id, cookie_path
from tally.metadata.store import MetadataStore, WatchKind, join

log = logging.getLogger(__name__)

_KIND = "cookie"
_FIELDS = frozenset({"bookie_id", "directories", "instance_id", "incarnation_id"})


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    directories: tuple[str, ...]
    """The bookie's journal and ledger directories, in its configuration's order."""
    instance_id: str
    """The cluster's instance id (see `cluster.ClusterInfo`)."""
    incarnation_id: str
    """New at each format of the bookie."""

    def __post_init__(self) -> None:
        check_bookie_id(self.bookie_id)
        if not isinstance(self.directories, tuple) or not self.directories:
            raise BadRequest(
                f"a cookie needs a non-empty tuple of directories: {self.directories!r}"
            )
        for directory in self.directories:
            if not isinstance(directory, str) or not directory:
                raise BadRequest(f"cookie directory {directory!r} is not a non-empty str")
        if len(set(self.directories)) != len(self.directories):
            raise BadRequest(f"cookie directories {list(self.directories)} repeat one")
        for name in ("instance_id", "incarnation_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise BadRequest(f"cookie {name} must be a non-empty str, got {value!r}")

    @classmethod
    def new(cls, bookie_id: str, directories: Sequence[str], instance_id: str) -> Cookie:
        """The cookie of a bookie being formatted now: a fresh incarnation id."""
        return cls(bookie_id, tuple(directories), instance_id, uuid.uuid4().hex)

    def to_bytes(self) -> bytes:
        return json_records.encode(
            _KIND,
            {
                "bookie_id": self.bookie_id,
                "directories": list(self.directories),
                "instance_id": self.instance_id,
                "incarnation_id": self.incarnation_id,
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes, source: str) -> Cookie:
        """Decode a cookie read from `source` (a key or a file, named in errors)."""
        record = json_records.decode(data, _KIND, _FIELDS, source)
        with json_records.building(source):
            return cls(
                bookie_id=record.text("bookie_id"),
                directories=record.texts("directories"),
                instance_id=record.text("instance_id"),
                incarnation_id=record.text("incarnation_id"),
            )

    def check_matches(self, other: Cookie, other_source: str) -> None:
        """CookieMismatch naming each field where `other` (read from `other_source`) differs."""
        differences = [
            f"{name}: {getattr(self, name)!r} here, {getattr(other, name)!r} in {other_source}"
            for name in ("bookie_id", "directories", "instance_id", "incarnation_id")
            if getattr(self, name) != getattr(other, name)
        ]
        if differences:
            raise CookieMismatch(
                f"cookie of bookie {self.bookie_id} disagrees with {other_source}: "
                + "; ".join(differences)
            )


@dataclass(frozen=True)
class VersionedCookie:
    cookie: Cookie
    version: int


class CookieManager:
    """The cookies in the store, one per bookie, updated by compare-and-set."""

    def __init__(self, store: MetadataStore):
        self.store = store

    async def get(self, bookie_id: str) -> VersionedCookie | None:
        """The bookie's cookie, or None when it has none (a bookie never formatted here)."""
        path = cookie_path(bookie_id)
        try:
            found = await self.store.get(path)
        except NoSuchKey:
            return None
        cookie = Cookie.from_bytes(found.data, f"cookie {path}")
        if cookie.bookie_id != bookie_id:
            raise CookieMismatch(f"cookie {path} is bookie {cookie.bookie_id}'s, not {bookie_id}'s")
        return VersionedCookie(cookie, found.version)

    async def put(self, cookie: Cookie, expected_version: int | None) -> int:
        """Write the cookie: a new one when `expected_version` is None (KeyExists if the
        bookie has one), else a CAS update (MetadataVersionConflict). Its new version."""
        path = cookie_path(cookie.bookie_id)
        if expected_version is None:
            try:
                await self.store.create(path, cookie.to_bytes())
            except KeyExists:
                raise KeyExists(
                    f"bookie {cookie.bookie_id} already has a cookie at {path}; update it "
                    "with its version, or delete it first"
                ) from None
            return 0
        return (await self.store.set(path, cookie.to_bytes(), expected_version)).version

    async def delete(self, bookie_id: str, expected_version: int | None = None) -> None:
        """Remove the bookie's cookie (NoSuchKey if it has none)."""
        await self.store.delete(cookie_path(bookie_id), expected_version)

    async def bookie_ids(self) -> list[str]:
        """Every bookie with a cookie: every bookie formatted for this cluster, up or down."""
        return await self.store.children(COOKIES)

    async def incarnations(self) -> dict[str, str]:
        """Every cookie's incarnation id by bookie id. A cookie that does not decode, or is
        another bookie's, is logged and left out: its bookie's incarnation is unknown."""
        names = await self.bookie_ids()
        paths = [join(COOKIES, name) for name in names]
        found: dict[str, str] = {}
        for name, path, value in zip(names, paths, await self.store.get_many(paths), strict=True):
            if value is None:
                continue  # deleted meanwhile
            try:
                cookie = Cookie.from_bytes(value.data, f"cookie {path}")
            except MalformedData as error:
                log.error("%s; bookie %s's incarnation is unknown", error, name)
                continue
            if cookie.bookie_id != name:
                log.error(
                    "cookie %s is bookie %s's; bookie %s's incarnation is unknown",
                    path,
                    cookie.bookie_id,
                    name,
                )
                continue
            found[name] = cookie.incarnation_id
        return found

    async def watch_incarnations(
        self, callback: Callable[[dict[str, str]], object]
    ) -> Watcher[dict[str, str]]:
        """Call `callback` with `incarnations()` now and whenever a cookie is created or
        deleted (a bookie formatted anew, or an operator's delete)."""
        return await Watcher.start(
            self.store,
            [(COOKIES, WatchKind.CHILDREN)],
            self.incarnations,
            callback,
            "the bookies' cookies",
        )
