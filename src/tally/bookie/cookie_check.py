"""A bookie's identity check at start: its directories and the store must agree (BP-31).

The first start of a bookie with empty directories formats it: a cookie with a fresh
incarnation id goes to the store, then into every directory. Every later start compares
the copies. A bookie id whose disks were wiped, a disk from another bookie or cluster, or
changed directories all stop the bookie with what differs and what to do, because serving
under an old identity without the old data would answer NoSuchEntry for entries it once
acknowledged, which is how ledgers get truncated.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from tally.bookie.ledger_placement import PlacementRecord, recorded_failures
from tally.core.errors import (
    BadRequest,
    ClusterNotInitialised,
    CookieMismatch,
    MalformedData,
    NoSuchKey,
    TallyError,
)
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
        version = await cookies.put(cookie, expected_version=None)
        try:
            for directory in directories:
                _write(directory, cookie)
        except OSError:
            # Nothing was ever written here: undo the format, or every later start (once the
            # disk has room, say) would take the bookie for one whose disks were wiped.
            for directory in directories:
                with contextlib.suppress(OSError):
                    (directory / COOKIE_FILE).unlink(missing_ok=True)
                    (directory / f"{COOKIE_FILE}.tmp").unlink(missing_ok=True)
            await cookies.delete(bookie_id, expected_version=version)
            raise
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


@dataclass(frozen=True)
class DirectoriesUpdate:
    """What `update_directories` changed."""

    cookie: Cookie
    added: tuple[str, ...]
    """New ledger directories, formatted."""
    replaced: tuple[str, ...]
    """Ledger directories found empty (a replaced disk), formatted again."""
    restored: tuple[str, ...]
    """Failed ledger directories put back in service with their data."""
    removed: tuple[str, ...]
    """Ledger directories no longer configured."""
    still_failed: tuple[str, ...]
    """Failed ledger directories left out of service, each with what to do."""


async def update_directories(
    cookies: CookieManager,
    bookie_id: str,
    journal_dir: Path,
    ledger_dirs: Sequence[Path],
    *,
    force: bool = False,
) -> DirectoriesUpdate:
    """Make a stopped bookie's cookie list `ledger_dirs` (its journal directory stays):
    format new empty directories, and empty ones standing for a disk that failed or was
    replaced, whose ledgers go to limbo and are repaired from their other copies
    (ledger_directories.py). Bringing back a directory that had not failed, or dropping
    one, gives up its ledgers' copies here: `force` says the operator means it. A failed
    directory that still holds its files comes back with them, on `force`, only if ledgers
    are still placed on it (no other directory could take them when it failed); else it
    stays out of service until emptied."""
    stored = await cookies.get(bookie_id)
    if stored is None:
        raise NoSuchKey(f"bookie {bookie_id} has no cookie in this cluster: start it to format it")
    old = stored.cookie
    journal_name = str(journal_dir.resolve())
    if old.directories[0] != journal_name:
        raise CookieMismatch(
            f"bookie {bookie_id}'s journal directory is {old.directories[0]}, not {journal_name}: "
            "only ledger directories can be added or replaced"
        )
    _check_identity(old, _read(journal_dir), journal_dir)
    failed = recorded_failures(journal_dir)
    still_placed = _placed_on(journal_dir) if failed else set()
    listed = set(old.directories[1:])
    names = [str(d.resolve()) for d in ledger_dirs]
    added: list[Path] = []
    replaced: list[Path] = []
    restored: list[Path] = []
    still_failed: list[str] = []
    given_up: list[str] = []
    for directory, name in zip(ledger_dirs, names, strict=True):
        if name not in listed:
            if _holds_data(directory):
                raise CookieMismatch(f"{directory} is not empty: a new ledger directory must be")
            added.append(directory)
            continue
        try:
            found, holds_data = _read(directory), _holds_data(directory)
        except OSError as error:
            if name in failed:
                continue  # still broken: out of service
            raise CookieMismatch(f"ledger directory {directory} cannot be read: {error}") from None
        if name in failed:
            if not holds_data:
                replaced.append(directory)
            elif name not in still_placed:
                still_failed.append(
                    f"{name} ({failed[name]}): its ledgers went to the other directories; "
                    "empty it (or replace its disk) to bring it back"
                )
            elif found is not None and force:
                _check_identity(old, found, directory)
                restored.append(directory)
            else:
                still_failed.append(
                    f"{name} ({failed[name]}): check the disk, then run this with --force to "
                    "bring it back with its data"
                )
        elif found is not None:
            _check_identity(old, found, directory)
        elif holds_data:
            raise CookieMismatch(
                f"ledger directory {directory} holds files but no cookie: not this bookie's; "
                "empty it (or mount the right disk), then run this again"
            )
        else:
            replaced.append(directory)
            given_up.append(name)
    removed = [name for name in old.directories[1:] if name not in names]
    given_up += [name for name in removed if name not in failed]
    if given_up and not force:
        raise BadRequest(
            f"bookie {bookie_id}: {', '.join(given_up)} would lose their ledgers' copies on "
            "this bookie (they are repaired from their other copies): confirm with --force, "
            "or mount the disk that holds them"
        )
    new = Cookie(bookie_id, (journal_name, *names), old.instance_id, old.incarnation_id)
    if new != old:
        await cookies.put(new, stored.version)
    back = [*replaced, *restored]
    for directory, name in zip([journal_dir, *ledger_dirs], [journal_name, *names], strict=True):
        if name not in failed or directory in back:
            _write(directory, new)
    cleared = [str(d.resolve()) for d in back] + removed
    if failed and cleared:
        record = PlacementRecord(journal_dir)
        try:
            for name in cleared:
                record.clear_failed(name)
        finally:
            record.close()
    return DirectoriesUpdate(
        new,
        added=tuple(str(d.resolve()) for d in added),
        replaced=tuple(str(d.resolve()) for d in replaced),
        restored=tuple(str(d.resolve()) for d in restored),
        removed=tuple(removed),
        still_failed=tuple(still_failed),
    )


def _placed_on(journal_dir: Path) -> set[str]:
    """The directories that ledgers are placed on, by the bookie's record."""
    record = PlacementRecord(journal_dir)
    try:
        return set(record.placements().values())
    finally:
        record.close()


def _check_identity(stored: Cookie, found: Cookie | None, directory: Path) -> None:
    """`found` (the cookie in `directory`) is the stored one's but for the directories."""
    if found is None or (found.bookie_id, found.instance_id, found.incarnation_id) != (
        stored.bookie_id,
        stored.instance_id,
        stored.incarnation_id,
    ):
        raise CookieMismatch(
            f"{directory} does not hold bookie {stored.bookie_id}'s cookie (incarnation "
            f"{stored.incarnation_id}): {'none' if found is None else found}; these are not "
            "its directories"
        )


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


def store_lost(journal_dir: Path, uri: str, problem: ClusterNotInitialised) -> TallyError:
    """What a bookie says when its store holds no cluster: that the store was lost, if its
    own directories hold a cookie (data of a cluster), naming the recovery; else `problem`."""
    try:
        cookie = _read(journal_dir)
    except (OSError, MalformedData):
        cookie = None
    if cookie is None:
        return problem
    return ClusterNotInitialised(
        f"the metadata store {uri} holds no tally cluster, but this bookie's directories hold "
        f"data of cluster {cookie.instance_id} (cookie in {journal_dir}): the store was lost "
        f"or wiped. Rebuild its metadata from the bookies with `tally cluster recover "
        f"--metadata {uri} --bookies ID,...` (README: the metadata store was lost), then "
        "start this bookie again"
    )


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
    """Whether the directory holds anything but what a new file system comes with (ext4's
    lost+found): a disk mounted there fresh is empty."""
    try:
        return any(path.name != "lost+found" for path in directory.iterdir())
    except FileNotFoundError:
        return False
