"""Measure what the bookie's check of an entry's CRC digest on the way in costs (issue 17,
corruption at the source), beside the CRC32C of the whole entry that the bookie already
computes for every add to check the frame (the same bytes, so the same work at best).

A V2 entry with a CRC32C digest of each size is checked ROUNDS times in this process:

    python bench/bench_digest_check.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from tally.core.digest import DigestType, crc32c  # noqa: E402
from tally.core.entry_format import EntryFormat, check_crc_digest, encode_entry  # noqa: E402
from tally.core.ids import LedgerId  # noqa: E402

SIZES = (100, 1024, 16 * 1024, 64 * 1024)


def per_call(function: Callable[[], object], rounds: int) -> float:
    """Microseconds per call, the best of three runs."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(rounds):
            function()
        best = min(best, (time.perf_counter() - started) / rounds)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20_000)
    rounds = parser.parse_args().rounds
    print(f"{'entry':>8}  {'digest check':>13}  {'frame CRC32C':>13}  ratio")
    for size in SIZES:
        entry = encode_entry(
            LedgerId(0, 1), 7, 6, size, os.urandom(size), DigestType.CRC32C, format=EntryFormat.V2
        )
        check = per_call(lambda entry=entry: check_crc_digest(entry), rounds)
        frame = per_call(lambda entry=entry: crc32c(entry), rounds)
        print(f"{size:>8}  {check:>10.2f} µs  {frame:>10.2f} µs  {check / frame:5.2f}")


if __name__ == "__main__":
    main()
