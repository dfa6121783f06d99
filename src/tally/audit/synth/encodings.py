"""The availability encoding of one ensemble position, in closed form and vectorised: the
healthy majority's availability rows come from arithmetic, without an EntryAvailability per
row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tally.core.availability import GROUP_SIZE, HEADER_SIZE, Int64Array


def expected_encodings(
    first: Int64Array,
    last: Int64Array,
    ensemble_size: Int64Array,
    write_quorum: Int64Array,
    position: Int64Array,
) -> tuple[pa.BinaryArray, Int64Array]:
    """`expected_entries(...).to_bytes()` of each row, vectorised: the encodings of the rows
    that hold anything, and which rows they are (grouped by layout, not in row order).

    Position p holds a cut first run, one periodic group of whole runs of WQ entries every
    E, and a cut last run (`expected_entries`). In canonical form the cut runs stay groups
    of their own (their sizes are below WQ), except when there are no whole runs and the two
    cut runs have the same size (then they make one group of two runs), and except when
    WQ = E (every run touches the next: one run, one group).
    """
    stop = last + 1
    run = first - (first - position + write_quorum - 1) % ensemble_size
    cut = run < first
    head_size = np.where(cut, np.minimum(run + write_quorum, stop) - first, 0)
    run = np.where(cut, run + ensemble_size, run)
    whole = np.maximum(0, (stop - write_quorum - run) // ensemble_size + 1)
    whole_first = run
    run = run + whole * ensemble_size
    tail_size = np.maximum(stop - run, 0)

    groups = np.zeros((len(first), 3), dtype=_GROUP_DTYPE)
    groups["first"][:, 0] = first
    groups["last"][:, 0] = first
    groups["size"][:, 0] = head_size
    groups["first"][:, 1] = whole_first
    groups["last"][:, 1] = whole_first + np.maximum(whole - 1, 0) * ensemble_size
    groups["size"][:, 1] = write_quorum
    groups["period"][:, 1] = np.where(whole > 1, ensemble_size, 0)
    groups["first"][:, 2] = run
    groups["last"][:, 2] = run
    groups["size"][:, 2] = tail_size
    layout = (head_size > 0) * 1 + (whole > 0) * 2 + (tail_size > 0) * 4

    paired = (layout == 5) & (head_size == tail_size)
    groups["last"][paired, 0] = run[paired]
    groups["period"][paired, 0] = (run - first)[paired]
    layout[paired] = 1
    one_run = (write_quorum == ensemble_size) & (stop > first)
    groups[one_run, 0] = 0
    groups["first"][one_run, 0] = first[one_run]
    groups["last"][one_run, 0] = first[one_run]
    groups["size"][one_run, 0] = (stop - first)[one_run]
    layout[one_run] = 1

    blocks, rows = [], []
    for kind in range(1, 8):
        chosen = np.flatnonzero(layout == kind)
        if chosen.size == 0:
            continue
        columns = [column for column in range(3) if kind >> column & 1]
        block = np.zeros((chosen.size, HEADER_SIZE + GROUP_SIZE * len(columns)), np.uint8)
        block[:, 7] = len(columns)  # the big-endian int32 group count at offset 4
        picked = np.ascontiguousarray(groups[chosen][:, columns])
        block[:, HEADER_SIZE:] = picked.view(np.uint8).reshape(chosen.size, -1)
        blocks.append(block.ravel())
        rows.append(chosen)
    held_rows = np.concatenate(rows) if rows else np.empty(0, np.int64)
    offsets = np.zeros(held_rows.size + 1, dtype=np.int32)
    counts = np.array([1, 1, 2, 1, 2, 2, 3])[layout[held_rows] - 1]
    np.cumsum(HEADER_SIZE + GROUP_SIZE * counts, out=offsets[1:])
    data = np.concatenate(blocks) if blocks else np.empty(0, np.uint8)
    encodings = pa.BinaryArray.from_buffers(
        pa.binary(), held_rows.size, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    return encodings, held_rows


_GROUP_DTYPE = np.dtype([("first", ">i8"), ("last", ">i8"), ("size", ">i4"), ("period", ">i4")])
