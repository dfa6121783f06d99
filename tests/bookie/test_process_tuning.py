"""The bookie process's runtime tuning: measured in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHURN = """
import collections, os, resource, sys
from tally.bookie.process_tuning import tune_memory_allocator
if sys.argv[1] == "tuned":
    assert tune_memory_allocator()
source = memoryview(os.urandom(300_000))
in_flight = collections.deque()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(3000):
    chunk = bytes(source[: 256 * 1024 - (i % 7) * 1000])  # a socket read
    for k in range(3):  # the entries decoded from it, kept until acknowledged
        in_flight.append(bytes(source[k * 70_000 : k * 70_000 + 65_600]))
    while len(in_flight) > 64:
        in_flight.popleft()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def test_the_tuned_allocator_stops_the_page_faults_of_a_bookies_allocations() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("mallopt is glibc's")
    untuned, tuned = page_faults("default"), page_faults("tuned")
    assert untuned > 3000, untuned  # several faults per round by default
    assert tuned < untuned / 10, (tuned, untuned)
