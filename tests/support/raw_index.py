"""A bookie's index opened raw (rocksdict), for tests that write what tally never would:
damaged values, an index from before a column family existed."""

from __future__ import annotations

from pathlib import Path

import rocksdict


def index_families(directory: Path) -> dict[str, rocksdict.Options]:
    """Every column family of the storage's index, to open it raw."""
    names = rocksdict.Rdict.list_cf(str(directory / "index"), rocksdict.Options(raw_mode=True))
    return {name: rocksdict.Options(raw_mode=True) for name in names if name != "default"}
