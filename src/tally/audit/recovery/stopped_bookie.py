"""The export of a stopped bookie, read from its files: for a machine whose bookie cannot
start (its store is gone, or it is being decommissioned).

Its storage is opened as the bookie opens it, and its journal replayed into it (in memory:
nothing is checkpointed), so the export holds what the bookie acknowledged after its last
checkpoint too, and ledgers that journal damage may have cut are fenced, as a start would
leave them. A running bookie holds its index's lock: that is refused, and says to ask the
running bookie (`--bookies`) instead.
"""

from __future__ import annotations

from collections.abc import Iterator

from tally.bookie.config import BookieConfig
from tally.bookie.cookie_check import COOKIE_FILE
from tally.bookie.journal import Journal
from tally.bookie.journal_records import replay_into
from tally.bookie.ledger_directories import LedgerDirectories
from tally.bookie.state_dump import state_records
from tally.core.errors import BadRequest, WriteFailed
from tally.core.protocol import StateRecord
from tally.metadata.cookies import Cookie


def stopped_bookie_records(config: BookieConfig) -> Iterator[StateRecord]:
    """The records a dump WITH_STATE of this bookie would give, from its files."""
    journal_dir = config.journal_directory
    cookie = bookie_cookie(config).to_bytes()
    try:
        storage = LedgerDirectories(
            config.ledger_directories,
            journal_dir,
            keeps_entries=config.keeps_entries,
            log_size_limit=config.entry_log_size_limit,
            direct_io=config.direct_io,
        )
    except WriteFailed as error:
        raise BadRequest(
            f"cannot open the bookie's storage under {config.data_dir}: {error} (is the bookie "
            "running? Then export it through `--bookies` instead)"
        ) from error
    try:
        journal = Journal(journal_dir, direct_io=config.direct_io)
        replay_into(journal, storage, keeps_entries=storage.keeps_entries)
        yield from state_records(storage, cookie)
    finally:
        storage.close()


def bookie_cookie(config: BookieConfig) -> Cookie:
    """The cookie in the bookie's journal directory."""
    path = config.journal_directory / COOKIE_FILE
    try:
        return Cookie.from_bytes(path.read_bytes(), str(path))
    except FileNotFoundError:
        raise BadRequest(
            f"no cookie in {path.parent}: not a bookie's journal directory, or one never "
            "formatted (give the bookie's --data-dir, or its --config)"
        ) from None
