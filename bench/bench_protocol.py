"""Measure the bookie wire protocol codec on the data path: ADD requests.

For entries with 100-byte and 64 KiB payloads, three rates from the same run:

- codec: `AddRequest.encode()` then `RequestReader.feed()` of the frame (one frame per
  feed, as a bookie receiving one add per read);
- with CRC32C: the whole checksum path as well, client `AddRequest.for_entry` (computes
  the CRC) and the bookie's `verify_crc`;
- reference: the raw rate of one `struct.pack` of the same header fields and a `bytes`
  concatenation with the entry, the floor of any encoder in Python, decoding not included.

    python bench/bench_protocol.py

`main()` returns the figures as a dict (operations per second) for other tools.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from tally.core.digest import DigestType, master_key
from tally.core.entry_format import encode_entry
from tally.core.ids import LedgerId
from tally.core.protocol import AddRequest, RequestReader

PAYLOADS = {"100 B": 100, "64 KiB": 64 * 1024}
LEDGER = LedgerId(0x0123_4567_89AB_CDEF, 42)
KEY = master_key(b"bench")
# The ADD frame up to its entry: length, version, operation, flags, request id, scope,
# ledger, entry, master key, CRC32C.
HEADER = struct.Struct(">IBBHQQQq32sI")


def best_rate(operations: int, repeats: int, action: Callable[[], object]) -> float:
    """Operations per second of the fastest of `repeats` loops of `operations` calls."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(operations):
            action()
        best = min(best, time.perf_counter() - started)
    return operations / best


def rates(payload_size: int, operations: int, repeats: int = 5) -> tuple[float, float, float]:
    """(codec, codec with CRC32C, struct.pack + concatenation) operations per second."""
    entry = encode_entry(LEDGER, 7, 6, payload_size, bytes(payload_size), DigestType.CRC32C)
    request = AddRequest.for_entry(1, entry, KEY)
    reader = RequestReader()

    def codec() -> object:
        return reader.feed(request.encode())

    def with_crc() -> None:
        for decoded in reader.feed(AddRequest.for_entry(1, entry, KEY).encode()):
            if isinstance(decoded, AddRequest):
                decoded.verify_crc()

    size = HEADER.size - 4 + len(entry)

    def reference() -> bytes:
        return HEADER.pack(size, 1, 1, 0, 1, LEDGER.scope, LEDGER.id, 7, KEY, 0) + entry

    codec()
    with_crc()
    return (
        best_rate(operations, repeats, codec),
        best_rate(operations, repeats, with_crc),
        best_rate(operations, repeats, reference),
    )


def main() -> dict[str, float]:
    figures: dict[str, float] = {}
    print("ADD encode + decode, ops/s (best of 5)  codec       + CRC32C    pack+concat (reference)")
    for label, size in PAYLOADS.items():
        codec, with_crc, reference = rates(size, 20_000 if size < 4096 else 5_000)
        key = label.replace(" ", "").lower()
        figures[f"add_{key}_codec_ops_per_s"] = codec
        figures[f"add_{key}_with_crc_ops_per_s"] = with_crc
        figures[f"add_{key}_pack_concat_ops_per_s"] = reference
        figures[f"add_{key}_codec_to_reference_ratio"] = codec / reference
        print(
            f"  payload {label:7s}                     {codec:10,.0f}  {with_crc:10,.0f}"
            f"  {reference:10,.0f}   (codec at {codec / reference:.1%} of the reference)"
        )
    return figures


if __name__ == "__main__":
    main()
