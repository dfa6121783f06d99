"""`tally tour`: the pure core at work on one ledger, for a newcomer to watch.

Everything shown is computed by `tally.core` (nothing is hard-coded): a 128-bit ledger
with an ensemble change, what each bookie should hold in the condensed encoding, bookies
that lost entries behind the cluster's back found by set arithmetic, an entry's bytes and
a flipped bit caught by its digest, and the quorum coverage rules of recovery.
"""

from __future__ import annotations

import secrets
import time

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from tally.core.answers import Answer
from tally.core.availability import EntryAvailability, SequenceGroup
from tally.core.digest import DigestType, mac_key
from tally.core.durability import check_ledger
from tally.core.entry_format import decode_entry, encode_entry
from tally.core.errors import BadDigest
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.quorum import (
    RecoveryRead,
    coverage_threshold,
)
from tally.core.schedule import expected_entries

ENTRIES = 1_000_000
ENSEMBLE_CHANGE_AT = 600_000
ENTRY_SIZE = 1024
PASSWORD = b"demo-password"


def run() -> None:
    """A tour of tally's core: placement, availability, durability checks, digests, quorums."""
    console = Console()
    console.print(Panel.fit("[bold]tally[/] — a tour of the core, on one ledger", style="cyan"))
    ledger_id = LedgerId.from_uuid()
    metadata = _write_ledger(console, ledger_id)
    held = _show_expected_availability(console, metadata)
    _show_lost_entries(console, metadata, held)
    _show_entry_digest(console, ledger_id)
    _show_recovery_rules(console)


def _write_ledger(console: Console, ledger_id: LedgerId) -> LedgerMetadata:
    bookies = [f"127.0.0.1:{3181 + i}" for i in range(6)]
    metadata = LedgerMetadata.create(
        ensemble=tuple(bookies[:5]),
        write_quorum=3,
        ack_quorum=2,
        digest_type=DigestType.CRC32C,
        password=PASSWORD,
        ctime_ms=int(time.time() * 1000),
        creator_token=secrets.token_bytes(16),
    )
    failed = bookies[2]
    second = tuple(bookies[5] if b == failed else b for b in metadata.segments[0].ensemble)
    metadata = metadata.with_ensemble_change(ENSEMBLE_CHANGE_AT, second)
    metadata = metadata.close(ENTRIES - 1, ENTRIES * ENTRY_SIZE)
    console.print(
        f"\nLedger [bold]{ledger_id.qualified_name}[/] (scope {ledger_id.scope:#x}): "
        f"E={metadata.ensemble_size} WQ={metadata.write_quorum} AQ={metadata.ack_quorum}, "
        f"{ENTRIES:,} entries of {ENTRY_SIZE} B, closed at entry {metadata.last_entry_id:,}.\n"
        f"Bookie {failed} failed at entry {ENSEMBLE_CHANGE_AT:,}: the writer changed the "
        f"ensemble. Metadata: {len(metadata.to_bytes())} bytes, CRC32C-sealed."
    )
    table = Table("segment", "entries", "ensemble (position 0..E-1)")
    for index, (segment, first, last) in enumerate(metadata.segments_with_bounds()):
        table.add_row(str(index), f"{first:,}..{last:,}", "  ".join(segment.ensemble))
    console.print(table)
    return metadata


def _show_expected_availability(
    console: Console, metadata: LedgerMetadata
) -> dict[str, EntryAvailability]:
    """Each bookie's entries by the round-robin schedule, in the BP-34 encoding."""
    e, wq = metadata.ensemble_size, metadata.write_quorum
    expected: dict[str, EntryAvailability] = {}
    for segment, first, last in metadata.segments_with_bounds():
        assert last is not None
        for position, bookie in enumerate(segment.ensemble):
            part = expected_entries(first, last, e, wq, position)
            expected[bookie] = expected.get(bookie, EntryAvailability.empty()).union(part)
    table = Table(
        "bookie",
        "entries held",
        "sequence groups",
        "encoded",
        "as a list of ids",
        title="What each bookie should hold (entry e goes to positions (e + k) mod E)",
    )
    for bookie, entries in sorted(expected.items()):
        table.add_row(
            bookie,
            f"{len(entries):,}",
            "; ".join(_group_text(g) for g in entries.groups),
            f"{len(entries.to_bytes())} B",
            f"{8 * len(entries):,} B",
        )
    console.print(table)
    return expected


def _show_lost_entries(
    console: Console, metadata: LedgerMetadata, expected: dict[str, EntryAvailability]
) -> None:
    """Two bookies lose entries behind the cluster's back; the durability check finds them."""
    bookies = sorted(expected)
    held: dict[str, EntryAvailability] = {}
    started = time.perf_counter()
    for bookie in bookies:
        ids = expected[bookie].to_numpy()
        if bookie == bookies[0]:
            ids = ids[(ids < 400_000) | (ids >= 400_100)]
        if bookie == bookies[1]:
            ids = ids[(ids < 400_050) | (ids > 400_052)]
        held[bookie] = EntryAvailability.from_entries(ids)
    encoded = time.perf_counter() - started
    started = time.perf_counter()
    verdict = check_ledger(metadata, held)
    checked = time.perf_counter() - started
    total = sum(len(a) for a in held.values())
    console.print(
        f"\n[bold]Bit rot[/]: {bookies[0]} lost entries 400,000..400,099 and {bookies[1]} lost "
        f"400,050..400,052. Encoding what the {len(bookies)} bookies still hold "
        f"({total:,} ids) took {encoded * 1000:.0f} ms; checking the ledger's durability "
        f"contract took {checked * 1000:.1f} ms."
    )
    table = Table("segment", "bookie", "position", "missing", "missing entries")
    for finding in verdict.findings:
        table.add_row(
            str(finding.segment_index),
            finding.bookie_id,
            str(finding.position),
            f"{len(finding.missing):,}",
            "; ".join(_group_text(g) for g in finding.missing.groups),
        )
    console.print(table)
    category = verdict.category.value if verdict.category else "healthy"
    console.print(
        f"Verdict: [bold red]{category}[/] — the worst entry has {verdict.fewest_copies} of "
        f"{metadata.write_quorum} copies (ack quorum {metadata.ack_quorum})."
    )


def _show_entry_digest(console: Console, ledger_id: LedgerId) -> None:
    key = mac_key(PASSWORD)
    payload = b"hello, durable world"
    data = encode_entry(ledger_id, 42, 41, 43 * len(payload), payload, DigestType.HMAC, key)
    decoded = decode_entry(data, DigestType.HMAC, key)
    console.print(
        f"\n[bold]An entry on the wire[/] (format {decoded.format.name}, HMAC-SHA256): "
        f"{len(data)} bytes = 41 header + 32 digest + {len(payload)} payload\n"
        f"  header {data[:41].hex(' ', 8)}"
    )
    corrupted = bytearray(data)
    corrupted[-3] ^= 0x10
    try:
        decode_entry(bytes(corrupted), DigestType.HMAC, key)
    except BadDigest as error:
        console.print(f"  one flipped bit in the payload → [red]BadDigest[/]: {error}")


def _show_recovery_rules(console: Console) -> None:
    table = Table(
        "WQ",
        "AQ",
        "negatives to close (WQ-AQ+1)",
        title="Recovery: an entry is unrecoverable only on quorum coverage of explicit negatives",
    )
    for wq, aq in [(2, 1), (2, 2), (3, 1), (3, 2), (3, 3), (4, 2), (4, 3), (4, 4)]:
        table.add_row(str(wq), str(aq), str(coverage_threshold(wq, aq)))
    console.print(table)
    read = RecoveryRead(entry_id=7, ensemble_size=3, write_quorum=3, ack_quorum=2)
    steps = [(0, Answer.NEGATIVE), (1, Answer.UNKNOWN), (2, Answer.NEGATIVE)]
    trail = []
    for position, response in steps:
        decision = read.record(position, response)
        trail.append(f"{response.value} → {decision.value}")
    console.print("Entry 7, WQ=3 AQ=2, answers one by one: " + ", ".join(trail))
    timeout_only = RecoveryRead(entry_id=8, ensemble_size=3, write_quorum=3, ack_quorum=2)
    for position in range(3):
        decision = timeout_only.record(
            position, Answer.NEGATIVE if position == 0 else Answer.UNKNOWN
        )
    console.print(
        f"Entry 8, one negative and two timeouts → [bold]{decision.value}[/]: timeouts are "
        "unknown, never negative, so recovery stops rather than truncate."
    )


def _group_text(group: SequenceGroup) -> str:
    first, last, size, period = group
    if first == last:
        return f"{first:,}+{size}"
    return f"{first:,}..{last:,} runs of {size} every {period}"
