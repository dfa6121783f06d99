"""A bookie's settings, with BookKeeper's meaning and defaults where it has the setting."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tally.core import protocol


@dataclass(frozen=True)
class BookieConfig:
    metadata: str = ""
    """Metadata store URI (`sqlite:///path`, `zk://host:port/root`, `memory://`)."""
    data_dir: Path = Path("bookie-data")
    """Holds `journal/` and `ledgers/` (entry logs and index) unless they are set apart."""
    journal_dir: Path | None = None
    ledger_dir: Path | None = None
    listen: str = "127.0.0.1:3181"
    """host:port to listen on; port 0 picks a free one."""
    bookie_id: str | None = None
    """Defaults to the advertised host:port, as in BookKeeper."""
    rack: str | None = None
    """Network location such as /region/rack, stored for the placement policy."""
    metrics_port: int | None = None
    """Serve the admin HTTP app (/metrics, /heartbeat, /api/v1/...) on this port (0: any
    free port); None: no HTTP."""
    session_timeout: float = 10.0
    """Metadata store session timeout, seconds (BookKeeper's zkTimeout)."""
    journal_file_size: int = 2 * 1024**3
    """Roll the journal at this size (journalMaxSizeMB)."""
    journal_preallocate_size: int = 16 * 1024**2
    journal_max_batch_bytes: int = 1024**2
    journal_max_batch_delay_ms: float = 0.0
    """Extra wait to grow a group commit; 0 as batching adapts to load by itself."""
    direct_io: bool = True
    """Write journal and entry logs with O_DIRECT, past the page cache (as BookKeeper's
    DirectEntryLogger); where the file system refuses it, they are written through it."""
    keep_large_entries_in_journal: bool | None = None
    """Let entries of 16 KiB and more stay where the journal wrote them instead of copying
    them into entry logs at each checkpoint (journal_entries.py): every byte is then written
    once. None: when the journal and ledger directories are on the same device, where the
    copy would halve the disk's bandwidth; on separate disks (BookKeeper's advice) they are
    copied, and the journal's disk holds only recent writes."""
    entry_log_size_limit: int = 1024**3
    """Roll entry logs at this size (logSizeLimit)."""
    flush_interval_ms: int = 60_000
    """Checkpoint at least this often (flushInterval)."""
    write_cache_max_bytes: int = 64 * 1024**2
    """Checkpoint early when the write cache holds this much."""
    disk_usage_threshold: float = 0.95
    disk_usage_lwm_threshold: float = 0.90
    disk_check_interval_ms: int = 10_000
    limbo_check_interval: float = 30.0
    """Seconds between two looks at the ledgers in limbo (after a damaged journal): whether
    they are closed and whole again, or still need marking for repair."""
    max_frame_size: int = protocol.MAX_FRAME_SIZE
    tls_cert: Path | None = None
    """PEM certificate chain; with tls_key, the bookie speaks TLS only."""
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    """When set, clients must present a certificate signed by this CA."""

    @property
    def journal_directory(self) -> Path:
        return self.journal_dir or self.data_dir / "journal"

    @property
    def ledger_directory(self) -> Path:
        return self.ledger_dir or self.data_dir / "ledgers"
