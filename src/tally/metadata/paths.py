"""Where every key of a tally cluster lives in the metadata store: the one map of paths.

Paths are relative to the store's root (a ZooKeeper URI's chroot), modelled on Apache
BookKeeper's layout, with each kind of key under a root of its own::

    /cluster                               the cluster record: instance id, layout version
    /idgen/<first id, 20 digits>           64-bit id sequence: the key's data version
    /ledgers/0000/0000/0000/0000/L0001     ledger metadata of scope-0 ledger 1
    /ledgers-scoped/<s0-4>/<s4-16>/<i0-12>/L<i12-16>
                                           ledger metadata of a scope != 0 ledger (hex digits)
    /available/writable/<bookie id>        ephemeral registrations of writable bookies
    /available/readonly/<bookie id>        ... and of read-only ones
    /racks/<bookie id>                     a bookie's rack and zone (persistent)
    /cookies/<bookie id>                   a bookie's cookie
    /underreplication/ledgers/...          under-replication marks, split as /ledgers is
    /underreplication/ledgers-scoped/...   ... and as /ledgers-scoped is
    /underreplication/locks/<qualified>    ephemeral per-ledger replication locks
    /underreplication/disabled             exists while replication is disabled
    /underreplication/lost_bookie_recovery_delay
    /underreplication/checks/<check>       last run of each periodic auditor check
    /underreplication/audit_request        an operator's request for an audit now
    /underreplication/incarnations/<bookie id>
                                           the incarnation the auditor last knew a bookie by
    /underreplication/lost/...             entries no copy is left of, split as /ledgers is
    /underreplication/lost-scoped/...      ... and as /ledgers-scoped is
    /auditor/vote-<sequence>               ephemeral sequential auditor election votes
    /settings                              the cluster settings (core.deletion.ClusterSettings)
    /tombstones/...                        tombstones of deleted ledgers, split as /ledgers is
    /tombstones-scoped/...                 ... and as /ledgers-scoped is

Per-ledger keys form a hierarchy so that no key has millions of children, whatever the
ids. A scope-0 id is written in 20 decimal digits (an unsigned 64-bit id has up to 20)
split 4/4/4/4/4, as BookKeeper's long hierarchical layout does with 19: sequential ids
fill one parent of 10,000 leaves at a time. A scoped id is its 32 hex digits: the scope
split 4/12, the id 12/4. Random (UUID) ids spread over the scope's first level (at most
65,536 children, each with few), while one scope holding sequential ids fills one parent
of at most 65,536 leaves at a time; a random id brings at most three parent keys. Names are
fixed-width, so the sorted children of a level are in id order and a walk of the tree
visits ledgers sorted by (scope, id). Leaves start with "L", as in BookKeeper.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from tally.core.errors import BadRequest
from tally.core.ids import LedgerId
from tally.metadata.store import join, parent_of

CLUSTER = "/cluster"
IDGEN = "/idgen"
LEDGERS = "/ledgers"
AVAILABLE = "/available"
WRITABLE = "/available/writable"
READONLY = "/available/readonly"
RACKS = "/racks"
COOKIES = "/cookies"
UNDERREPLICATION = "/underreplication"
UNDERREPLICATED_LEDGERS = "/underreplication/ledgers"
LOCKS = "/underreplication/locks"
REPLICATION_DISABLED = "/underreplication/disabled"
LOST_BOOKIE_RECOVERY_DELAY = "/underreplication/lost_bookie_recovery_delay"
CHECKS = "/underreplication/checks"
AUDIT_REQUEST = "/underreplication/audit_request"
LAST_MARKED = "/underreplication/last_marked"
"""When a mark was last made or changed: the replication workers watch it (the marks' tree
is split by ledger id, and a watch of one key is what every store has)."""
INCARNATIONS = "/underreplication/incarnations"
LOST_ENTRIES = "/underreplication/lost"
AUDITOR = "/auditor"
AUDITOR_VOTE_PREFIX = "/auditor/vote-"
SETTINGS = "/settings"
TOMBSTONES = "/tombstones"

LEAF_PREFIX = "L"
SCOPED_SUFFIX = "-scoped"
IDGEN_NAME_DIGITS = 20
MAX_BOOKIE_ID_BYTES = 255


@dataclass(frozen=True)
class Hierarchy:
    """How one kind of ledger id is spelled as nested key names (see the module doc)."""

    root: str
    widths: tuple[int, ...]
    """Characters per level; the last level is the leaf, prefixed with LEAF_PREFIX."""
    hexadecimal: bool

    @property
    def depth(self) -> int:
        return len(self.widths)

    @functools.cached_property
    def patterns(self) -> tuple[re.Pattern[str], ...]:
        """Per level, what a name there must look like."""
        digit = "[0-9a-f]" if self.hexadecimal else "[0-9]"
        return tuple(
            re.compile(f"{LEAF_PREFIX if level == self.depth - 1 else ''}{digit}{{{width}}}")
            for level, width in enumerate(self.widths)
        )

    def path(self, digits: str) -> str:
        names, start = [], 0
        for width in self.widths:
            names.append(digits[start : start + width])
            start += width
        names[-1] = LEAF_PREFIX + names[-1]
        return "/".join([self.root, *names])

    def digits(self, path: str) -> str | None:
        """The id's digits spelled by `path`, or None if it is not a leaf of this hierarchy."""
        if not path.startswith(self.root + "/"):
            return None
        names = path[len(self.root) + 1 :].split("/")
        if len(names) != self.depth:
            return None
        if not all(p.fullmatch(name) for p, name in zip(self.patterns, names, strict=True)):
            return None
        return "".join(names[:-1]) + names[-1][len(LEAF_PREFIX) :]

    def ledger_id(self, digits: str) -> LedgerId | None:
        """The ledger that an id's digits here spell; None if none can (too big, scope 0)."""
        try:
            if not self.hexadecimal:
                return LedgerId.classic(int(digits))
            ledger_id = LedgerId(int(digits[:16], 16), int(digits[16:], 16))
        except BadRequest:
            return None
        return None if ledger_id.is_classic else ledger_id


@dataclass(frozen=True)
class LedgerTree:
    """One kind of per-ledger key: scope-0 ids under `root`, scoped ones under root-scoped."""

    root: str
    classic: Hierarchy = field(init=False)
    scoped: Hierarchy = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "classic", Hierarchy(self.root, (4, 4, 4, 4, 4), False))
        object.__setattr__(
            self, "scoped", Hierarchy(self.root + SCOPED_SUFFIX, (4, 12, 12, 4), True)
        )

    @property
    def hierarchies(self) -> tuple[Hierarchy, Hierarchy]:
        """Both, in the order a walk visits them: all of scope 0 sorts first."""
        return self.classic, self.scoped

    def path(self, ledger_id: LedgerId) -> str:
        if ledger_id.is_classic:
            return self.classic.path(f"{ledger_id.id:020d}")
        return self.scoped.path(ledger_id.qualified_name)

    def ledger_id(self, path: str) -> LedgerId:
        """The ledger that `path` is the key of; BadRequest when it is not a ledger's key."""
        for hierarchy in self.hierarchies:
            digits = hierarchy.digits(path)
            ledger_id = None if digits is None else hierarchy.ledger_id(digits)
            if ledger_id is not None:
                return ledger_id
        raise BadRequest(f"{path} is not a ledger's key under {self.root}")

    def parents(self, ledger_id: LedgerId) -> list[str]:
        """The intermediate keys above a ledger's key, nearest first, roots excluded."""
        hierarchy = self.classic if ledger_id.is_classic else self.scoped
        found, path = [], parent_of(self.path(ledger_id))
        while path != hierarchy.root:
            found.append(path)
            path = parent_of(path)
        return found


LEDGER_METADATA = LedgerTree(LEDGERS)
UNDER_REPLICATION_MARKS = LedgerTree(UNDERREPLICATED_LEDGERS)
LOST_ENTRY_RECORDS = LedgerTree(LOST_ENTRIES)
TOMBSTONE_RECORDS = LedgerTree(TOMBSTONES)

ROOTS = (
    IDGEN,
    LEDGERS,
    LEDGERS + SCOPED_SUFFIX,
    AVAILABLE,
    WRITABLE,
    READONLY,
    RACKS,
    COOKIES,
    UNDERREPLICATION,
    UNDERREPLICATED_LEDGERS,
    UNDERREPLICATED_LEDGERS + SCOPED_SUFFIX,
    LOCKS,
    CHECKS,
    INCARNATIONS,
    LOST_ENTRIES,
    LOST_ENTRIES + SCOPED_SUFFIX,
    AUDITOR,
    TOMBSTONES,
    TOMBSTONES + SCOPED_SUFFIX,
)
"""The persistent parents `tally cluster init` creates, each after its own parent."""


def check_bookie_id(bookie_id: object) -> str:
    """`bookie_id` if it can name a key (one path component); BadRequest otherwise."""
    if not isinstance(bookie_id, str):
        raise BadRequest(f"a bookie id is a str, not {type(bookie_id).__name__}")
    if bookie_id in ("", ".", ".."):
        raise BadRequest(f"bookie id {bookie_id!r} cannot name a key")
    if "/" in bookie_id or not bookie_id.isprintable():
        raise BadRequest(f"bookie id {bookie_id!r} contains '/' or unprintable characters")
    if len(bookie_id.encode()) > MAX_BOOKIE_ID_BYTES:
        raise BadRequest(f"bookie id {bookie_id!r} is longer than {MAX_BOOKIE_ID_BYTES} bytes")
    return bookie_id


def writable_path(bookie_id: str) -> str:
    return join(WRITABLE, check_bookie_id(bookie_id))


def readonly_path(bookie_id: str) -> str:
    return join(READONLY, check_bookie_id(bookie_id))


def rack_path(bookie_id: str) -> str:
    return join(RACKS, check_bookie_id(bookie_id))


def cookie_path(bookie_id: str) -> str:
    return join(COOKIES, check_bookie_id(bookie_id))


def incarnation_path(bookie_id: str) -> str:
    return join(INCARNATIONS, check_bookie_id(bookie_id))


def lock_path(ledger_id: LedgerId) -> str:
    return join(LOCKS, ledger_id.qualified_name)


def check_path_of(name: str) -> str:
    """The key of an auditor check's last-run time."""
    return join(CHECKS, name)


def idgen_bucket_path(first_id: int) -> str:
    return join(IDGEN, f"{first_id:0{IDGEN_NAME_DIGITS}d}")


def idgen_bucket_first_id(name: str) -> int | None:
    """The first id of the bucket called `name`; None for a name that is not one."""
    if len(name) != IDGEN_NAME_DIGITS or not name.isdigit() or not name.isascii():
        return None
    return int(name)
