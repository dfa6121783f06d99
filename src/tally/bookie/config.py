"""A bookie's settings, with BookKeeper's meaning and defaults where it has the setting.

Loaded by `tally.config.load` (section `[bookie]`, variables `TALLY_BOOKIE_<SETTING>`);
durations are in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tally.bookie.compactor import GcSettings
from tally.bookie.journal import (
    DEFAULT_FILE_SIZE,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_PREALLOCATE_SIZE,
)
from tally.bookie.journal_format import HEADER_SIZE
from tally.config import check
from tally.core import protocol
from tally.core.addresses import split_host_port
from tally.core.compaction import CompactionPolicy
from tally.core.disk_usage import (
    DEFAULT_JOURNAL_RETRY_INTERVAL,
    DEFAULT_LOW_WATER_MARK,
    DEFAULT_USAGE_THRESHOLD,
)
from tally.core.errors import BadRequest, BadSetting
from tally.core.scrub import ScrubPolicy
from tally.metadata.store import DEFAULT_SESSION_TIMEOUT

MAX_READ_THREADS = 256


@dataclass(frozen=True)
class BookieConfig:
    metadata: str = ""
    """Metadata store URI (`sqlite:///path`, `zk://host:port/root`, `memory://`)."""
    data_dir: Path = Path("bookie-data")
    """Holds `journal/` and `ledgers/` (entry logs and index) unless they are set apart."""
    journal_dir: Path | None = None
    ledger_dir: Path | None = None
    """One ledger directory: `ledger_dirs` with one path."""
    ledger_dirs: tuple[Path, ...] = ()
    """Ledger directories, each on a disk of its own (a TOML list; comma-separated in
    TALLY_BOOKIE_LEDGER_DIRS and --ledger-dirs). Each ledger is placed on one when it first
    arrives and stays there (ledger_directories.py); a directory whose disk fails is taken
    out of service while the others go on. Added to a formatted bookie with
    `tally shell cookie update`. Neither this nor ledger_dir: `ledgers/` under data_dir."""
    listen: str = "127.0.0.1:3181"
    """host:port to listen on; port 0 picks a free one."""
    advertised_address: str | None = None
    """host:port clients reach this bookie at, registered for them (a proxy or NAT in
    between, BookKeeper's advertisedAddress); None: the address it listens on."""
    bookie_id: str | None = None
    """Defaults to the advertised host:port, as in BookKeeper."""
    rack: str | None = None
    """Network location such as /region/rack, stored for the placement policy."""
    metrics_port: int | None = None
    """Serve the admin HTTP app (/metrics, /heartbeat, /api/v1/...) on this port (0: any
    free port); None: no HTTP."""
    session_timeout: float = DEFAULT_SESSION_TIMEOUT
    """Metadata store session timeout, seconds (BookKeeper's zkTimeout)."""
    journal_file_size: int = DEFAULT_FILE_SIZE
    """Roll the journal at this size (journalMaxSizeMB)."""
    journal_preallocate_size: int = DEFAULT_PREALLOCATE_SIZE
    journal_max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    journal_max_batch_delay: float = 0.0
    """Seconds a group commit may wait for company (journalMaxGroupWaitMSec); 0, as
    batching adapts to the load by itself."""
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
    flush_interval: float = 60.0
    """Seconds between checkpoints at most (flushInterval)."""
    write_cache_max_bytes: int = 64 * 1024**2
    """Checkpoint early when the write cache holds this much."""
    disk_usage_threshold: float = DEFAULT_USAGE_THRESHOLD
    """Fraction of a data disk used at which the bookie turns read-only."""
    disk_usage_lwm_threshold: float = DEFAULT_LOW_WATER_MARK
    """... and below which it turns writable again."""
    disk_check_interval: float = 10.0
    """Seconds between two looks at the disks' usage."""
    journal_retry_interval: float = DEFAULT_JOURNAL_RETRY_INTERVAL
    """Seconds between two attempts at a new journal file while the journal cannot write (out
    of room, or its disk failing; the bookie is read-only meanwhile); tried at the disk
    checks."""
    disk_usage_warn_threshold: float = 0.90
    """Fraction of the ledger disk used from which major compaction stops
    (diskUsageWarnThreshold; disk_usage_threshold if that is lower); minor compaction stops
    at disk_usage_threshold."""
    is_force_gc_allow_when_no_space: bool = False
    """Compact even above those thresholds (isForceGCAllowWhenNoSpace): copying the few live
    entries of sparse files is then how the bookie gets space back."""
    minor_compaction_threshold: float = 0.2
    """Compact the entry logs and kept journal files less live than this
    (minorCompactionThreshold) every minor_compaction_interval; 0: no minor compaction."""
    minor_compaction_interval: float = 3600.0
    major_compaction_threshold: float = 0.8
    """... and those less live than this every major_compaction_interval (a day); 0: none."""
    major_compaction_interval: float = 86400.0
    minor_compaction_max_time: float = 600.0
    """Seconds one garbage collection run spends compacting at most; the next run goes on
    where it stopped (minorCompactionMaxTimeMillis). 0: no bound."""
    major_compaction_max_time: float = 600.0
    compaction_rate_bytes: int = 0
    """Bytes per second that compaction copies at most (compactionRateByBytes); 0: no
    limit (it takes the storage's lock a bounded chunk at a time either way)."""
    scrub_interval: float = 604800.0
    """Seconds from the end of one scrub pass (every stored entry read back and checked
    against its CRC32C and the index) to the start of the next (localScrubPeriod); 0: scrub
    only when asked (`tally shell scrub --now`)."""
    scrub_rate_bytes: int = 0
    """Bytes per second a scheduled scrub pass reads at most (localScrubRateLimit); 0: the
    ledger disk's size over scrub_interval, so that a pass over a full disk takes about one
    interval (at least 64 KiB/s). A pass asked for runs at full speed."""
    limbo_check_interval: float = 30.0
    """Seconds between two looks at the ledgers in limbo (after a damaged journal): whether
    they are closed and whole again, or still need marking for repair."""
    gc_wait_time: float = 600.0
    """Seconds between two garbage collection runs (gcWaitTime): tombstones read, their
    ledgers dropped and acknowledged, space reclaimed."""
    gc_overreplicated_ledger_wait_time: float = 86400.0
    """Seconds between two looks for over-replicated ledgers and orphans
    (gcOverreplicatedLedgerWaitTime): every ledger held here is looked up in the store."""
    tombstone_retention: float = 2592000.0
    """Seconds a bookie remembers a ledger it deleted because its tombstone said so (30
    days): while it does, a metadata recovery from the bookies never brings the ledger
    back, even from a copy on a bookie that was away when it was deleted."""
    read_threads: int = 1
    """Threads that read entries from the disks for READ and READ_ENTRIES
    (numReadWorkerThreads), so that a read waiting on a slow disk stalls no add; entries in
    memory or the page cache are answered on the event loop. One by default: here a second
    made a repair no faster, and more reads at once cost a writer beside a repair more
    (docs/benchmarks.md, bench_reads); disks that serve many reads at once may want more.
    0: reads from the disks on the event loop too, which then waits for each."""
    max_frame_size: int = protocol.MAX_FRAME_SIZE
    receive_buffer_limit_bytes: int = 64 * 1024**2
    """Bytes that frames begun and not yet complete may hold, over all connections (at
    least max_frame_size). A connection whose frame needs more waits, unread, for its turn."""
    receive_stall_timeout: float = 30.0
    """Seconds a connection in the middle of a frame may send nothing before it is closed
    (time spent waiting for receive_buffer_limit_bytes does not count)."""
    tls_cert: Path | None = None
    """PEM certificate chain; with tls_key, the bookie speaks TLS only."""
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    """When set, clients must present a certificate signed by this CA."""

    def __post_init__(self) -> None:
        try:
            split_host_port(self.listen, port_zero=True)
        except BadRequest as error:
            raise BadSetting("listen", str(error)) from None
        if self.advertised_address is not None:
            try:
                split_host_port(self.advertised_address)
            except BadRequest as error:
                raise BadSetting("advertised_address", str(error)) from None
        for name in (
            "session_timeout",
            "flush_interval",
            "disk_check_interval",
            "journal_retry_interval",
            "gc_wait_time",
            "gc_overreplicated_ledger_wait_time",
            "tombstone_retention",
            "receive_stall_timeout",
        ):
            check(getattr(self, name) > 0, name, "must be more than 0 seconds")
        check(self.journal_max_batch_delay >= 0, "journal_max_batch_delay", "must not be negative")
        check(
            self.journal_file_size > HEADER_SIZE,
            "journal_file_size",
            f"must exceed the {HEADER_SIZE}-byte file header",
        )
        for name in (
            "journal_preallocate_size",
            "journal_max_batch_bytes",
            "entry_log_size_limit",
            "write_cache_max_bytes",
            "max_frame_size",
        ):
            check(getattr(self, name) > 0, name, "must be more than 0 bytes")
        check(
            self.receive_buffer_limit_bytes >= self.max_frame_size,
            "receive_buffer_limit_bytes",
            f"must hold at least one frame of max_frame_size ({self.max_frame_size} bytes)",
        )
        check(
            0 < self.disk_usage_lwm_threshold <= self.disk_usage_threshold <= 1,
            "disk_usage_lwm_threshold",
            f"needs 0 < it <= disk_usage_threshold ({self.disk_usage_threshold}) <= 1",
        )
        check(
            0 < self.disk_usage_warn_threshold <= 1,
            "disk_usage_warn_threshold",
            "needs 0 < it <= 1",
        )
        check(
            0 <= self.minor_compaction_threshold <= self.major_compaction_threshold < 1,
            "minor_compaction_threshold",
            f"needs 0 <= it <= major_compaction_threshold ({self.major_compaction_threshold}) < 1",
        )
        for name in (
            "minor_compaction_interval",
            "major_compaction_interval",
            "minor_compaction_max_time",
            "major_compaction_max_time",
            "compaction_rate_bytes",
            "scrub_interval",
            "scrub_rate_bytes",
        ):
            check(getattr(self, name) >= 0, name, "must not be negative")
        check(
            0 <= self.read_threads <= MAX_READ_THREADS,
            "read_threads",
            f"must be in 0..{MAX_READ_THREADS}",
        )
        if self.metrics_port is not None:
            check(0 <= self.metrics_port < 65536, "metrics_port", "must be in 0..65535")
        check(
            self.ledger_dir is None or not self.ledger_dirs,
            "ledger_dirs",
            "give ledger_dir or ledger_dirs, not both",
        )
        check(
            len(set(self.ledger_dirs)) == len(self.ledger_dirs),
            "ledger_dirs",
            "names a directory twice",
        )
        check(
            self.journal_directory not in self.ledger_directories,
            "ledger_dirs" if self.ledger_dirs else "ledger_dir",
            "the journal needs a directory of its own",
        )
        check(
            (self.tls_cert is None) == (self.tls_key is None),
            "tls_cert" if self.tls_cert is None else "tls_key",
            "TLS needs both tls_cert and tls_key",
        )

    @property
    def gc_settings(self) -> GcSettings:
        """Garbage collection's settings, as ledger storage takes them."""
        return GcSettings(
            policy=CompactionPolicy(
                minor_threshold=self.minor_compaction_threshold,
                minor_interval=self.minor_compaction_interval,
                major_threshold=self.major_compaction_threshold,
                major_interval=self.major_compaction_interval,
                warn_usage=min(self.disk_usage_warn_threshold, self.disk_usage_threshold),
                full_usage=self.disk_usage_threshold,
                force_when_no_space=self.is_force_gc_allow_when_no_space,
            ),
            rate_bytes=self.compaction_rate_bytes,
            minor_max_time=self.minor_compaction_max_time,
            major_max_time=self.major_compaction_max_time,
        )

    @property
    def scrub_policy(self) -> ScrubPolicy:
        return ScrubPolicy(interval=self.scrub_interval, rate_bytes=self.scrub_rate_bytes)

    def keeps_entries(self, ledger_dir: Path) -> bool:
        """Whether ledger storage in `ledger_dir` reads large entries where the journal wrote
        them: the setting, else whether the directory shares the journal's device."""
        if self.keep_large_entries_in_journal is not None:
            return self.keep_large_entries_in_journal
        return ledger_dir.stat().st_dev == self.journal_directory.stat().st_dev

    @property
    def journal_directory(self) -> Path:
        return self.journal_dir or self.data_dir / "journal"

    @property
    def ledger_directories(self) -> tuple[Path, ...]:
        if self.ledger_dirs:
            return self.ledger_dirs
        return (self.ledger_dir or self.data_dir / "ledgers",)
