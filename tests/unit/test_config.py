"""Config loading: the order of sources, conversions, and refusals that name the source."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tally.bookie.config import BookieConfig
from tally.config import check, load, metadata_uri
from tally.core.errors import BadRequest


@dataclass(frozen=True)
class Sample:
    journal_dir: Path = Path("journal")
    flush_interval_ms: int = 1000
    disk_usage_threshold: float = 0.95
    read_only_on_error: bool = True
    rack: str | None = None
    ledger_dirs: tuple[Path, ...] = (Path("ledgers"),)


def test_defaults_when_nothing_is_given() -> None:
    assert load(Sample, "bookie", env={}) == Sample()


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "tally.toml"
    config.write_text(
        "[bookie]\nflush-interval-ms = 50\nrack = '/a/b'\nledger_dirs = ['x', 'y']\n"
        "[client]\nignored = 1\n"
    )
    env = {"TALLY_BOOKIE_FLUSH_INTERVAL_MS": "70", "TALLY_BOOKIE_READ_ONLY_ON_ERROR": "no"}
    loaded = load(
        Sample, "bookie", file=config, env=env, overrides={"rack": "/c", "journal_dir": None}
    )
    assert loaded.flush_interval_ms == 70
    assert loaded.read_only_on_error is False
    assert loaded.rack == "/c"
    assert loaded.journal_dir == Path("journal")
    assert loaded.ledger_dirs == (Path("x"), Path("y"))


def test_environment_lists_are_comma_separated() -> None:
    loaded = load(Sample, "bookie", env={"TALLY_BOOKIE_LEDGER_DIRS": "a, b"})
    assert loaded.ledger_dirs == (Path("a"), Path("b"))


def test_unknown_file_key_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    config = tmp_path / "tally.toml"
    config.write_text("[bookie]\nflush_intervall_ms = 5\n")
    with pytest.raises(BadRequest, match=r"no setting 'flush_intervall_ms'.*flush_interval_ms"):
        load(Sample, "bookie", file=config, env={})


def test_unknown_environment_variable_is_refused() -> None:
    with pytest.raises(BadRequest, match="TALLY_BOOKIE_RAKC names no bookie setting"):
        load(Sample, "bookie", env={"TALLY_BOOKIE_RAKC": "/a"})


def test_other_sections_variables_are_not_ours() -> None:
    assert load(Sample, "bookie", env={"TALLY_CLIENT_X": "1", "TALLY_METADATA": "m"}) == Sample()


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("TALLY_BOOKIE_FLUSH_INTERVAL_MS", "soon", "expected int"),
        ("TALLY_BOOKIE_READ_ONLY_ON_ERROR", "maybe", "expected true or false"),
        ("TALLY_BOOKIE_DISK_USAGE_THRESHOLD", "high", "expected float"),
    ],
)
def test_bad_values_name_their_source(var: str, value: str, message: str) -> None:
    with pytest.raises(BadRequest, match=f"environment variable {var}: {message}"):
        load(Sample, "bookie", env={var: value})


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[bookie\n")
    with pytest.raises(BadRequest, match="not valid TOML"):
        load(Sample, "bookie", file=broken, env={})
    with pytest.raises(BadRequest, match="cannot read config file"):
        load(Sample, "bookie", file=tmp_path / "absent.toml", env={})


def test_toml_types_are_checked(tmp_path: Path) -> None:
    config = tmp_path / "tally.toml"
    config.write_text("[bookie]\nread_only_on_error = 'sure'\n")
    with pytest.raises(BadRequest, match=r"\[bookie\] read_only_on_error: expected true or false"):
        load(Sample, "bookie", file=config, env={})


@dataclass(frozen=True)
class Checked:
    metadata: str = ""
    session_timeout: float = 10.0

    def __post_init__(self) -> None:
        check(self.session_timeout > 0, "session_timeout", "must be more than 0 seconds")


def test_tally_metadata_serves_every_component_unless_its_own_setting_is_given() -> None:
    env = {"TALLY_METADATA": "zk://z:2181/t"}
    assert load(Checked, "bookie", env=env).metadata == "zk://z:2181/t"
    both = {**env, "TALLY_BOOKIE_METADATA": "sqlite:///own.db"}
    assert load(Checked, "bookie", env=both).metadata == "sqlite:///own.db"
    assert load(Checked, "bookie", env=env, overrides={"metadata": "memory://"}).metadata == (
        "memory://"
    )
    assert load(Checked, "bookie", env={}).metadata == ""
    assert metadata_uri(None, environment=env) == "zk://z:2181/t"
    assert metadata_uri("memory://", environment=env) == "memory://"
    assert metadata_uri(None, environment={}) is None


@pytest.mark.parametrize(
    ("sources", "where"),
    [
        ({"env": {"TALLY_AUTORECOVERY_SESSION_TIMEOUT": "-1"}}, "environment variable "),
        ({"overrides": {"session_timeout": 0}}, "option --session-timeout"),
    ],
)
def test_a_value_the_config_refuses_names_the_setting_and_its_source(
    sources: dict[str, Any], where: str
) -> None:
    env = sources.get("env", {})
    with pytest.raises(BadRequest, match=f"autorecovery setting session_timeout = .*from {where}"):
        load(Checked, "autorecovery", env=env, overrides=sources.get("overrides"))


def test_a_refused_value_from_a_file_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "tally.toml"
    config.write_text("[autorecovery]\nsession_timeout = -2.5\n")
    with pytest.raises(
        BadRequest,
        match=r"session_timeout = -2.5 \(from .*tally.toml \[autorecovery\] session_timeout\): "
        "must be more than 0 seconds",
    ):
        load(Checked, "autorecovery", file=config, env={})


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("TALLY_BOOKIE_FLUSH_INTERVAL", "0", "flush_interval .*must be more than 0 seconds"),
        ("TALLY_BOOKIE_LISTEN", "nowhere", "listen = .nowhere. .*not host:port"),
        ("TALLY_BOOKIE_ADVERTISED_ADDRESS", "proxy", "advertised_address .*not host:port"),
        ("TALLY_BOOKIE_DISK_USAGE_LWM_THRESHOLD", "0.99", "disk_usage_lwm_threshold"),
        ("TALLY_BOOKIE_TLS_CERT", "cert.pem", "needs both tls_cert and tls_key"),
        ("TALLY_BOOKIE_MINOR_COMPACTION_THRESHOLD", "0.9", "minor_compaction_threshold"),
        ("TALLY_BOOKIE_MAJOR_COMPACTION_THRESHOLD", "1.0", "minor_compaction_threshold"),
        ("TALLY_BOOKIE_COMPACTION_RATE_BYTES", "-1", "compaction_rate_bytes .*not be negative"),
        ("TALLY_BOOKIE_DISK_USAGE_WARN_THRESHOLD", "1.5", "disk_usage_warn_threshold"),
        (
            "TALLY_BOOKIE_RECEIVE_BUFFER_LIMIT_BYTES",
            "1048576",
            "receive_buffer_limit_bytes .*at least one frame of max_frame_size",
        ),
        ("TALLY_BOOKIE_RECEIVE_STALL_TIMEOUT", "0", "receive_stall_timeout .*more than 0 seconds"),
        ("TALLY_BOOKIE_READ_THREADS", "-1", "read_threads .*must be in 0..256"),
        ("TALLY_BOOKIE_READ_THREADS", "257", "read_threads .*must be in 0..256"),
        ("TALLY_BOOKIE_JOURNAL_RETRY_INTERVAL", "0", "journal_retry_interval .*more than 0"),
    ],
)
def test_the_bookie_config_refuses_what_cannot_work(
    variable: str, value: str, problem: str
) -> None:
    with pytest.raises(BadRequest, match=problem):
        load(BookieConfig, "bookie", env={variable: value})


def test_the_bookie_config_gives_garbage_collection_its_settings() -> None:
    config = load(
        BookieConfig,
        "bookie",
        env={
            "TALLY_BOOKIE_MINOR_COMPACTION_INTERVAL": "60",
            "TALLY_BOOKIE_MAJOR_COMPACTION_THRESHOLD": "0.5",
            "TALLY_BOOKIE_COMPACTION_RATE_BYTES": "1000000",
            "TALLY_BOOKIE_IS_FORCE_GC_ALLOW_WHEN_NO_SPACE": "true",
        },
    )
    settings = config.gc_settings
    assert settings.policy.minor_interval == 60.0
    assert settings.policy.minor_threshold == 0.2
    assert settings.policy.major_threshold == 0.5
    assert settings.policy.major_interval == 86400.0
    assert (settings.policy.warn_usage, settings.policy.full_usage) == (0.90, 0.95)
    assert settings.policy.force_when_no_space
    assert settings.rate_bytes == 1_000_000
    assert settings.major_max_time == 600.0
    lowered = load(
        BookieConfig,
        "bookie",
        env={
            "TALLY_BOOKIE_DISK_USAGE_THRESHOLD": "0.5",
            "TALLY_BOOKIE_DISK_USAGE_LWM_THRESHOLD": "0.4",
        },
    )
    assert lowered.gc_settings.policy.warn_usage == 0.5, "never above the disk-full threshold"
