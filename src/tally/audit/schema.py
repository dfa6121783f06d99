"""The audit snapshot and its findings as Arrow schemas: a contract, not an implementation detail.

Other tools and synthetic generators write snapshots too, so the column names, types and
meanings here change only with `FORMAT_VERSION`. A snapshot directory holds one Parquet
dataset per table (`ledgers/`, `segments/`, `bookies/`, `availability/`, `tombstones/`,
`unreadable/`) and
`snapshot.json`, which records the cluster settings the checks apply (`cluster_settings`:
`ClusterSettings.to_dict()`, `deletion_stuck_after` among them). Ledger ids are two
unsigned 64-bit halves; Parquet has no unsigned 64-bit type that Spark reads, so each half
is stored as the int64 with the same bits (`to_int64` / `from_int64`), which keeps equality
and joins exact.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path

import pyarrow as pa

from tally.core.errors import BadRequest
from tally.core.ids import UINT64_MAX

FORMAT_VERSION = 4
"""2: DELETED ledgers with their archival bit and deletion time, tombstones/, and the
cluster settings in snapshot.json. 3: each ledger's metadata as the store keeps it. 4:
unreadable/, the store's ledger and tombstone records that do not decode."""

LEDGERS = "ledgers"
SEGMENTS = "segments"
BOOKIES = "bookies"
AVAILABILITY = "availability"
TOMBSTONES = "tombstones"
UNREADABLE = "unreadable"
SNAPSHOT_JSON = "snapshot.json"
CLUSTER_SETTINGS = "cluster_settings"
"""snapshot.json's key for the cluster settings when the snapshot was taken."""
TRUTH_JSON = "truth.json"
SNAPSHOT_TABLES = (LEDGERS, SEGMENTS, BOOKIES, AVAILABILITY, TOMBSTONES, UNREADABLE)
SNAPSHOT_PARTS = (*SNAPSHOT_TABLES, SNAPSHOT_JSON)
"""What a snapshot directory holds."""

VIOLATIONS = "violations"
OVER_REPLICATED = "over_replicated"
SUMMARY_JSON = "summary.json"
REPORT_HTML = "report.html"

LEDGERS_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.int64(), nullable=False),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("ensemble_size", pa.int32(), nullable=False),
        pa.field("write_quorum", pa.int32(), nullable=False),
        pa.field("ack_quorum", pa.int32(), nullable=False),
        pa.field("last_entry_id", pa.int64(), nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("ctime_ms", pa.int64(), nullable=False),
        pa.field("digest_type", pa.string(), nullable=False),
        pa.field("underreplicated_since_ms", pa.int64(), nullable=True),
        pa.field("archived", pa.bool_(), nullable=False),
        pa.field("deleted_ms", pa.int64(), nullable=True),
        pa.field("metadata", pa.binary(), nullable=True),
    ]
)
"""One row per ledger with metadata; state is OPEN / IN_RECOVERY / CLOSED / DELETED,
last_entry_id -1 when empty or not closed (a DELETED ledger keeps the end it was closed at),
digest_type a DigestType name (CRC32C, ...), archived the archival bit, deleted_ms when a
DELETED ledger was deleted (null otherwise), metadata the ledger's whole metadata as the store
keeps it (`LedgerMetadata.to_bytes`: master key and custom metadata included, what
`tally cluster recover --from-snapshot` restores from; null where a synthetic snapshot does
not make it). A DELETED ledger keeps its data on purpose until its metadata becomes a
tombstone: it is neither judged nor orphaned."""

SEGMENTS_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.int64(), nullable=False),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("segment_index", pa.int32(), nullable=False),
        pa.field("first_entry_id", pa.int64(), nullable=False),
        pa.field("last_entry_id", pa.int64(), nullable=False),
        pa.field("ensemble", pa.list_(pa.string()), nullable=False),
    ]
)
"""One row per segment; last_entry_id is the next segment's first - 1, else the ledger's
last entry (first - 1 for a segment with no entries, -1 for an open ledger's last one);
ensemble lists bookie ids in ensemble order."""

BOOKIES_SCHEMA = pa.schema(
    [
        pa.field("bookie_id", pa.string(), nullable=False),
        pa.field("rack", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("responded", pa.bool_(), nullable=False),
    ]
)
"""Every bookie registered or named by an ensemble; state is writable / readonly /
unregistered; responded tells whether its availability dump completed."""

AVAILABILITY_SCHEMA = pa.schema(
    [
        pa.field("bookie_id", pa.string(), nullable=False),
        pa.field("scope", pa.int64(), nullable=False),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("availability", pa.binary(), nullable=False),
    ]
)
"""One row per (bookie, ledger) the bookie holds; availability is the seed-000 encoding
(`EntryAvailability.to_bytes`)."""

TOMBSTONES_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.int64(), nullable=False),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("deleted_ms", pa.int64(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("violations", pa.int64(), nullable=False),
        pa.field("check_detail", pa.string(), nullable=False),
        pa.field("tombstoned_ms", pa.int64(), nullable=False),
        pa.field("last_entry_id", pa.int64(), nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("bookies", pa.list_(pa.string()), nullable=False),
        pa.field("acknowledged_ms", pa.list_(pa.int64()), nullable=False),
    ]
)
"""One row per tombstone (what is left of a ledger deleted past its retention), as the store
keeps it (`tally.core.deletion.Tombstone`): when and why it was deleted, the durability
check's missing copies then (violations, -1 when not checked) and verdict, when the tombstone
was written, the ledger's end, and the bookies it names with, at the same index, when each
acknowledged dropping the ledger's data (null until it has). Data of a tombstoned ledger is
not orphan: its bookies drop it at their next garbage collection, or it is deletion_stuck."""

UNREADABLE_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.int64(), nullable=False),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("record", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("error", pa.string(), nullable=False),
    ]
)
"""One row per record of the store, under a ledger's key, that does not decode: record is
"ledger" (its metadata) or "tombstone", path the key, error why. Its ledger is reported
invalid_metadata, and the data its bookies hold of it is neither judged nor orphan: the
metadata is there, only unreadable. (A key that names no ledger is only counted.)"""

VIOLATIONS_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.int64(), nullable=True),
        pa.field("ledger_id", pa.int64(), nullable=True),
        pa.field("category", pa.string(), nullable=False),
        pa.field("segment_index", pa.int32(), nullable=True),
        pa.field("bookie_id", pa.string(), nullable=True),
        pa.field("missing_count", pa.int64(), nullable=True),
        pa.field("detail", pa.string(), nullable=False),
    ]
)
"""One row per violation (category: a `tally.core.ledger_audit.Category` value, never
over_replicated); ledger columns are null for a bookie-level finding
(unresponsive_registered_bookie)."""

OVER_REPLICATED_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.int64(), nullable=False),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("segment_index", pa.int32(), nullable=False),
        pa.field("bookie_id", pa.string(), nullable=False),
        pa.field("entries", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
    ]
)
"""One row per (ledger, segment, bookie) with extra copies: entries of the segment that the
bookie holds although no write set puts them there, and their payload bytes estimated at the
ledger's mean entry size (the snapshot has no entry sizes). Over-replication, kept apart
from the violations: it never lowers durability."""


class BookieState(enum.Enum):
    WRITABLE = "writable"
    READONLY = "readonly"
    UNREGISTERED = "unregistered"


def require_snapshot(path: Path, formats: tuple[int, ...] = (FORMAT_VERSION,)) -> None:
    """BadRequest unless `path` holds a snapshot's tables in one of `formats` (as far as its
    snapshot.json says): cheap to ask before Spark starts. A format-3 snapshot has no
    unreadable/ (a metadata recovery reads one: the store it was taken of is gone)."""
    how = (
        f"with `tally audit snapshot --metadata URI --out {path}` (or `tally audit synth` for "
        "a synthetic one)"
    )
    recorded = _recorded_format(path)
    if recorded is not None and recorded not in formats:
        readable = " or ".join(str(number) for number in formats)
        raise BadRequest(
            f"the audit snapshot at {path} has format {recorded}, and this tally reads format "
            f"{readable}: take a new one {how}"
        )
    tables = [table for table in SNAPSHOT_TABLES if recorded != 3 or table != UNREADABLE]
    missing = [table for table in tables if not (path / table).is_dir()]
    if missing:
        found = "no such directory" if not path.is_dir() else f"no {', '.join(missing)} in it"
        raise BadRequest(f"no audit snapshot at {path} ({found}): take one {how}")


def _recorded_format(path: Path) -> object:
    """snapshot.json's format_version; None when it has none, or cannot be read."""
    try:
        recorded = json.loads((path / SNAPSHOT_JSON).read_text())
    except (OSError, ValueError):
        return None
    return recorded.get("format_version") if isinstance(recorded, dict) else None


def to_int64(half: int) -> int:
    """An unsigned 64-bit id half as the int64 with the same bits."""
    return half - (1 << 64) if half > UINT64_MAX >> 1 else half


def from_int64(stored: int) -> int:
    """The unsigned 64-bit id half that `to_int64` stored."""
    return stored + (1 << 64) if stored < 0 else stored
