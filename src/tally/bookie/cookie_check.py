"""A bookie's identity check at start: its directories and the store must agree (BP-31).

The first start of a bookie with empty directories formats it: a cookie with a fresh
incarnation id goes to the store, then into every directory. Every later start compares
the copies. A bookie id whose disks were wiped, a disk from another bookie or cluster, or
changed directories all stop the bookie with what differs and what to do, because serving
under an old identity without the old data would answer NoSuchEntry for entries it once
acknowledged, which is how ledgers get truncated.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from pathlib import Path

from tally.core.errors import CookieMismatch
from tally.metadata.cookies import Cookie, CookieManager

log = logging.getLogger(__name__)

COOKIE_FILE = "COOKIE"


async def verify_or_format(
    cookies: CookieManager,
    bookie_id: str,
    directories: list[Path],
    instance_id: str,
    *,
    failed: Collection[str] = (),
) -> Cookie:
    """The bookie's cookie, after checking every copy (or formatting a brand-new bookie).

    `directories`: the journal's, then the ledger directories; the copies in those named in
    `failed` (ledger directories out of service since their disks failed) are not read."""
    names = [str(d.resolve()) for d in directories]
    on_disk = {
        d: _read(d) for d, name in zip(directories, names, strict=True) if name not in failed
    }
    stored = await cookies.get(bookie_id)
    found = {d: c for d, c in on_disk.items() if c is not None}

    if stored is None and not found:
        used = [d for d in directories if _holds_data(d)]
        if used:
            raise CookieMismatch(
                f"bookie {bookie_id}: {', '.join(map(str, used))} hold data but no cookie, and "
                "the metadata store has none: these directories were not formatted by this "
                "cluster. Empty them to start a new bookie, or point the bookie at its own "
                "directories."
            )
        cookie = Cookie.new(bookie_id, names, instance_id)
        await cookies.put(cookie, expected_version=None)
        for directory in directories:
            _write(directory, cookie)
        log.info(
            "bookie %s formatted: incarnation %s, directories %s",
            bookie_id,
            cookie.incarnation_id,
            names,
        )
        return cookie

    if stored is None:
        clusters = ", ".join(sorted({cookie.instance_id for cookie in found.values()}))
        raise CookieMismatch(
            f"bookie {bookie_id}: {', '.join(map(str, found))} hold its cookie of cluster "
            f"instance {clusters}, but the metadata store (cluster instance {instance_id}) has "
            "no cookie for it (was the cluster re-initialised, or the cookie deleted?). Do not "
            "start it under this id: its disks belong to another cluster or another "
            "incarnation. Point it at its own cluster's metadata store, or decommission it."
        )
    if stored.cookie.instance_id == instance_id and stored.cookie.directories != tuple(names):
        raise CookieMismatch(
            f"bookie {bookie_id} is configured with the directories {names}, but its cookie "
            f"lists {list(stored.cookie.directories)}. To add ledger directories or replace "
            f"a failed one, stop the bookie and run `tally shell cookie update {bookie_id}` "
            "with its configuration; to change anything else, decommission the bookie (its "
            "ledgers re-replicate), delete its cookie with `tally shell cookie delete`, then "
            "start it as a new bookie."
        )
    expected = Cookie(bookie_id, tuple(names), instance_id, stored.cookie.incarnation_id)
    _check(stored.cookie, expected, "this bookie's configuration and cluster")
    missing = [d for d, cookie in on_disk.items() if cookie is None]
    if missing:
        ledger_dirs_only = directories[0] not in missing
        raise CookieMismatch(
            f"bookie {bookie_id} is known to the cluster (incarnation "
            f"{stored.cookie.incarnation_id}) but {', '.join(map(str, missing))} have no cookie: "
            "the disks were wiped or replaced. Starting it would answer 'no such entry' for "
            "entries it acknowledged. "
            + (
                "If a ledger disk is not mounted, mount it; if it was replaced by an empty one, "
                f"run `tally shell cookie update {bookie_id} --force` with the bookie's "
                "configuration to bring it back (its ledgers are then repaired from their "
                "other copies)."
                if ledger_dirs_only
                else "Decommission the bookie (its ledgers re-replicate), delete its cookie "
                "with `tally shell cookie delete`, then start it as a new bookie."
            )
        )
    for directory, cookie in found.items():
        _check(stored.cookie, cookie, str(directory / COOKIE_FILE))
    return stored.cookie


def _check(stored: Cookie, other: Cookie, source: str) -> None:
    """The store's cookie must match `other`; a mismatch says what differs and what to do."""
    try:
        stored.check_matches(other, source)
    except CookieMismatch as error:
        raise CookieMismatch(
            f"{error} (the first value is the metadata store's cookie). Start the bookie with "
            "the directories, disks and metadata store its cookie records. To change them, "
            "decommission the bookie (its ledgers re-replicate), delete its cookie with "
            "`tally shell cookie delete`, then start it as a new bookie."
        ) from None


def _read(directory: Path) -> Cookie | None:
    path = directory / COOKIE_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return Cookie.from_bytes(data, str(path))


def _write(directory: Path, cookie: Cookie) -> None:
    """Write atomically (temp file, fsync, rename, fsync the directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f"{COOKIE_FILE}.tmp"
    with temporary.open("wb") as handle:
        handle.write(cookie.to_bytes())
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(directory / COOKIE_FILE)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _holds_data(directory: Path) -> bool:
    try:
        return any(directory.iterdir())
    except FileNotFoundError:
        return False
