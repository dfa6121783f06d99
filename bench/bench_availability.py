"""Measure the entry availability encoding and the auditor's comparison.

Two promises of the availability issue, each beside its physical reference from the same run:

- encoding a sorted numpy array of 10 million entry ids runs at >= 10 million ids/s; the
  reference is one plain numpy pass (np.diff) over the same array, the floor of any
  vectorised encoder;
- comparing a healthy ledger's expected entries with what a bookie reports costs O(groups):
  the same at 10 entries as at 10^7 (the ratio of the two times should be about 1).

    python bench/bench_availability.py

`main()` returns the figures as a dict (ids/s, seconds, ratio) for other tools.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from tally.core.availability import EntryAvailability
from tally.core.schedule import expected_entries

ENTRIES = 10_000_000
ENSEMBLE_SIZE, WRITE_QUORUM, POSITION = 3, 2, 0


def best_of(repeats: int, action: Callable[[], object]) -> float:
    """The fastest of `repeats` runs, in seconds: the least disturbed by the machine."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def encoding_rates(ids: np.ndarray, repeats: int = 5) -> tuple[float, float]:
    """(encoder ids/s, np.diff ids/s) over the same array."""
    encode = best_of(repeats, lambda: EntryAvailability.from_entries(ids))
    diff = best_of(repeats, lambda: np.diff(ids))
    return ids.size / encode, ids.size / diff


def comparison_seconds(entries: int, repeats: int) -> float:
    """One auditor check of a healthy bookie: decode its report, compute what it should hold
    in closed form, take the difference. The report is built beforehand, as a bookie would."""
    last = entries - 1
    stored = expected_entries(0, last, ENSEMBLE_SIZE, WRITE_QUORUM, POSITION).to_numpy()
    report = EntryAvailability.from_entries(stored).to_bytes()

    def check() -> None:
        available = EntryAvailability.from_bytes(report)
        expected = expected_entries(0, last, ENSEMBLE_SIZE, WRITE_QUORUM, POSITION)
        if expected.difference(available):
            raise AssertionError(f"a healthy ledger of {entries} entries reports missing entries")

    return best_of(repeats, check)


def main() -> dict[str, float]:
    healthy = expected_entries(
        0, ENTRIES * ENSEMBLE_SIZE // WRITE_QUORUM - 1, ENSEMBLE_SIZE, WRITE_QUORUM, POSITION
    ).to_numpy()[:ENTRIES]
    contiguous = np.arange(ENTRIES, dtype=np.int64)
    encode_healthy, diff_healthy = encoding_rates(healthy)
    encode_contiguous, diff_contiguous = encoding_rates(contiguous)
    small, large = comparison_seconds(10, 2000), comparison_seconds(ENTRIES, 200)
    figures = {
        "encode_healthy_ids_per_s": encode_healthy,
        "numpy_diff_healthy_ids_per_s": diff_healthy,
        "encode_contiguous_ids_per_s": encode_contiguous,
        "numpy_diff_contiguous_ids_per_s": diff_contiguous,
        "compare_10_entries_s": small,
        "compare_10m_entries_s": large,
        "compare_ratio": large / small,
    }
    print(f"encoding {ENTRIES:,} sorted ids (best of 5)     encoder       np.diff (reference)")
    print(
        f"  healthy E={ENSEMBLE_SIZE} WQ={WRITE_QUORUM} position {POSITION}"
        f"      {encode_healthy / 1e6:8.1f} M/s  {diff_healthy / 1e6:8.1f} M/s"
    )
    print(
        f"  contiguous                      {encode_contiguous / 1e6:8.1f} M/s"
        f"  {diff_contiguous / 1e6:8.1f} M/s"
    )
    print("healthy ledger check: from_bytes + expected_entries + difference (best of many)")
    print(
        f"  10 entries {small * 1e6:8.1f} us   {ENTRIES:,} entries {large * 1e6:8.1f} us"
        f"   ratio {large / small:.2f}"
    )
    return figures


if __name__ == "__main__":
    main()
