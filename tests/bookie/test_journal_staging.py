"""The journal's staging buffers: written in the order taken, whatever the record sizes and
whenever the journal thread takes them, they lay down exactly the journal's bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.bookie.direct_io import ALIGNMENT, aligned_up
from tally.bookie.journal_staging import SPARE_BUFFERS, JournalStage, StagedBuffer

HEADER = bytes(range(40))


def new_file_header(file_id: int, previous_id: int, previous_end: int) -> bytes:
    return b"H" + bytes([file_id, previous_id]) + previous_end.to_bytes(8, "big") + bytes(29)


def stage(file_size: int = 1 << 30, batch_bytes: int = 1000) -> JournalStage[int]:
    return JournalStage(
        1, HEADER, file_size=file_size, batch_bytes=batch_bytes, new_file_header=new_file_header
    )


def write(files: dict[int, bytearray], buffer: StagedBuffer[int]) -> None:
    """What the journal thread does with a buffer: its padded bytes at its offset."""
    with buffer.padded() as data:
        assert buffer.start % ALIGNMENT == 0
        assert len(data) % ALIGNMENT == 0
        image = files.setdefault(buffer.file_id, bytearray())
        if len(image) < buffer.start + len(data):
            image.extend(bytes(buffer.start + len(data) - len(image)))
        image[buffer.start : buffer.start + len(data)] = data


record_sizes = st.lists(
    st.one_of(st.integers(1, 300), st.integers(4000, 70_000)), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(sizes=record_sizes, takes=st.lists(st.booleans(), min_size=40, max_size=40))
def test_buffers_written_in_order_lay_down_the_records_and_their_ends(
    sizes: list[int], takes: list[bool]
) -> None:
    staging = stage(batch_bytes=20_000)
    records = [bytes([n % 251 + 1]) * size for n, size in enumerate(sizes)]
    files: dict[int, bytearray] = {}
    waiters: list[int] = []
    ends: list[int] = []
    for number, (record, take_now) in enumerate(zip(records, takes, strict=False)):
        staging.add(record[:10], record[10:], number)
        while take_now and (buffer := staging.take()) is not None:
            write(files, buffer)
            waiters += buffer.waiters
            ends += buffer.ends
            staging.give_back(buffer)
    while (buffer := staging.take()) is not None:
        write(files, buffer)
        waiters += buffer.waiters
        ends += buffer.ends
    assert staging.queued_bytes == 0
    expected = HEADER + b"".join(records)
    assert bytes(files[1][: len(expected)]) == expected
    assert not any(files[1][len(expected) :])
    assert waiters == list(range(len(records)))
    assert ends == [len(HEADER) + sum(sizes[: n + 1]) for n in range(len(sizes))]
    assert staging.position == (1, len(expected))


def drained(staging: JournalStage[int]) -> tuple[dict[int, bytearray], list[int], list[int]]:
    files: dict[int, bytearray] = {}
    waiters: list[int] = []
    ends: list[int] = []
    while (buffer := staging.take()) is not None:
        write(files, buffer)
        waiters += buffer.waiters
        ends += buffer.ends
    return files, waiters, ends


@settings(max_examples=60, deadline=None)
@given(
    sizes=record_sizes,
    cuts=st.lists(st.booleans(), min_size=40, max_size=40),
    takes=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_runs_lay_down_their_records_with_a_waiter_on_each_runs_last(
    sizes: list[int], cuts: list[bool], takes: list[bool]
) -> None:
    """Runs of records (cut where `cuts` says) staged with add_all while the journal thread
    takes and gives back buffers between them: the journal's bytes, each record's end, and
    a waiter only on the last record of each run."""
    staging = stage(batch_bytes=20_000)
    records = [bytes([n % 251 + 1]) * size for n, size in enumerate(sizes)]
    last = [cuts[n] or n == len(records) - 1 for n in range(len(records))]
    files: dict[int, bytearray] = {}
    waiters: list[int] = []
    ends: list[int] = []
    run: list[tuple[bytes, bytes]] = []
    for number, record in enumerate(records):
        run.append((record[:10], record[10:]))
        if last[number]:
            staging.add_all(run, number, -1)
            run = []
        while (takes[number] or number == len(records) - 1) and (
            buffer := staging.take()
        ) is not None:
            write(files, buffer)
            waiters += buffer.waiters
            ends += buffer.ends
            staging.give_back(buffer)
    expected = HEADER + b"".join(records)
    assert bytes(files[1][: len(expected)]) == expected
    assert not any(files[1][len(expected) :])
    assert staging.queued_bytes == 0
    assert waiters == [n if last[n] else -1 for n in range(len(records))]
    assert ends == [len(HEADER) + sum(sizes[: n + 1]) for n in range(len(sizes))]


@settings(max_examples=60, deadline=None)
@given(sizes=record_sizes, cuts=st.lists(st.booleans(), min_size=40, max_size=40))
def test_a_run_staged_at_once_is_staged_as_its_records_one_by_one(
    sizes: list[int], cuts: list[bool]
) -> None:
    """Across buffers and files (a run may cross both): the same bytes, waiters and ends as
    the run's records staged one call each."""
    one, many = stage(file_size=150_000, batch_bytes=20_000), stage(150_000, 20_000)
    records = [bytes([n % 251 + 1]) * size for n, size in enumerate(sizes)]
    run: list[tuple[bytes, bytes]] = []
    for number, (record, cut) in enumerate(zip(records, cuts, strict=False)):
        last = cut or number == len(records) - 1
        one.add(record[:10], record[10:], number if last else -1)
        run.append((record[:10], record[10:]))
        if last:
            many.add_all(run, number, -1)
            run = []
    assert drained(one) == drained(many)
    assert one.position == many.position


def test_a_batch_is_sealed_at_the_record_that_reaches_batch_bytes() -> None:
    staging = stage(batch_bytes=1000)
    for number in range(25):
        staging.add(b"", bytes(100), number)
    batches = []
    while (buffer := staging.take()) is not None:
        batches.append(buffer.waiters)
    assert batches == [list(range(10)), list(range(10, 20)), list(range(20, 25))]


def test_a_record_longer_than_a_buffer_goes_on_in_the_next_and_is_answered_in_its_last() -> None:
    staging = stage(batch_bytes=1000)
    long = bytes(range(256)) * 1000
    staging.add(b"head", long, 7)
    taken = []
    while (buffer := staging.take()) is not None:
        taken.append(buffer)
    assert len(taken) >= 3
    assert [buffer.waiters for buffer in taken] == [[]] * (len(taken) - 1) + [[7]]
    files: dict[int, bytearray] = {}
    for buffer in taken:
        write(files, buffer)
    assert bytes(files[1][: 40 + 4 + len(long)]) == HEADER + b"head" + long


def test_a_record_that_would_pass_file_size_starts_a_new_file_with_its_header() -> None:
    staging = stage(file_size=10_000, batch_bytes=100_000)
    staging.add(b"", bytes(6000), 1)
    staging.add(b"", bytes(6000), 2)
    first, second = staging.take(), staging.take()
    assert first is not None
    assert second is not None
    assert staging.take() is None
    assert (first.file_id, first.previous, first.waiters) == (1, None, [1])
    assert (second.file_id, second.previous, second.waiters) == (2, (1, 6040), [2])
    expected_header = new_file_header(2, 1, 6040)
    assert bytes(second.memory[: len(expected_header)]) == expected_header
    assert second.ends == [len(expected_header) + 6000]


def test_a_record_longer_than_a_file_gets_a_file_of_its_own() -> None:
    staging = stage(file_size=5000, batch_bytes=100_000)
    staging.add(b"", bytes(8000), 1)
    staging.add(b"", bytes(10), 2)
    ids = []
    while (buffer := staging.take()) is not None:
        ids.append((buffer.file_id, buffer.waiters))
    assert ids == [(1, [1]), (2, [2])]


def test_discard_returns_every_waiter_and_empties_the_stage() -> None:
    staging = stage(batch_bytes=1000)
    for number in range(25):
        staging.add(b"", bytes(100), number)
    assert staging.discard() == list(range(25))
    assert staging.queued_bytes == 0
    assert staging.take() is None


def test_written_buffers_are_reused_up_to_a_few() -> None:
    staging = stage(batch_bytes=1000)
    for number in range(10 * SPARE_BUFFERS):
        staging.add(b"", bytes(1000), number)
    taken = []
    while (buffer := staging.take()) is not None:
        taken.append(buffer)
    for buffer in taken:
        staging.give_back(buffer)
    assert sum(not buffer.memory.closed for buffer in taken) == SPARE_BUFFERS
    staging.add(b"", bytes(1000), 98)  # fills the buffer made before the give-back
    staging.add(b"", bytes(1000), 99)  # and the next one
    assert staging.take() is not None
    reused = staging.take()
    assert reused is not None
    assert any(reused.memory is buffer.memory for buffer in taken)
    staging.give_back(reused)
    staging.close()
    assert reused.memory.closed


def test_padding_is_zeros_up_to_the_block() -> None:
    staging = stage()
    staging.add(b"", b"\xff" * 100, 1)
    buffer = staging.take()
    assert buffer is not None
    buffer.memory[140:200] = b"\xee" * 60  # stale bytes of an earlier use of the memory
    with buffer.padded() as data:
        assert len(data) == aligned_up(140)
        assert bytes(data[140:]) == bytes(len(data) - 140)
