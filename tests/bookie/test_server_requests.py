"""Every request a bookie serves, against one real bookie process on loopback.

The module shares one cluster and one bookie; each test writes ledgers of its own, and the
metrics tests compare scrapes taken before and after their own traffic. The bookie's frame
limit is small (16 KiB) so that an availability dump spans many frames.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType, crc32c
from tally.core.errors import (
    BadDigest,
    BadRequest,
    LedgerFenced,
    NoSuchEntry,
    NoSuchLedger,
    Unauthorized,
)
from tally.core.ids import LedgerId
from tally.core.protocol import (
    KEEP_IN_PLACE,
    MAX_LEDGERS_PER_LIST,
    RESPONSE_HEADER_SIZE,
    AddRequest,
    AvailabilityDumpRequest,
    AvailabilityDumpResponse,
    ErrorResponse,
    LedgerInfo,
    ReadRequest,
    ReadResponse,
    StateKind,
    StateRecord,
)
from tests.bookie.conftest import (
    KEY,
    OTHER_KEY,
    BookieUnderTest,
    RawConnection,
    connected,
    entry,
    in_process_bookie,
    new_ledger,
    running,
    sample,
)
from tests.support.polling import until

MAX_FRAME_SIZE = 16 * 1024
DUMP_SCOPE = 0xD0_D0
"""The dump test's ledgers, told apart from the other tests' (scope 0) by their scope."""
DUMP_LEDGERS = 3000
STATE_SCOPE = 0x57_A7E


@pytest.fixture(scope="module")
def bookie(cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieUnderTest]:
    data_dir = tmp_path_factory.mktemp("requests") / "bookie"
    with running(
        BookieUnderTest(cluster, data_dir, settings={"max_frame_size": MAX_FRAME_SIZE})
    ) as started:
        yield started


async def add_all(address: str, entries: list[bytes], key: bytes = KEY) -> None:
    async with connected(address) as connection:
        await asyncio.gather(*(connection.add_nowait(data, key) for data in entries))


# --- adds and reads -------------------------------------------------------------------------


async def test_entries_read_back_one_by_one_and_as_the_last(bookie: BookieUnderTest) -> None:
    ledger = new_ledger()
    entries = [entry(ledger, i, b"payload %d" % i * i) for i in range(5)]
    async with connected(bookie.address) as connection:
        for data in entries:
            await connection.add(data, KEY)
        for i, data in enumerate(entries):
            assert await connection.read(ledger, i) == data
        assert await connection.read(ledger, -1) == entries[-1]
        assert await connection.read_lac(ledger) == 3  # piggy-backed on entry 4


async def test_out_of_order_adds_and_the_list_of_entries(bookie: BookieUnderTest) -> None:
    ledger = new_ledger()
    held = [7, 0, 2, 1, 5]
    await add_all(bookie.address, [entry(ledger, i) for i in held])
    async with connected(bookie.address) as connection:
        listed = await connection.get_list_of_entries(ledger)
        assert list(listed) == sorted(held)
        assert listed == EntryAvailability.from_entries(held)
        assert await connection.read(ledger, -1) == entry(ledger, 7)
        with pytest.raises(NoSuchEntry):
            await connection.read(ledger, 3)


async def test_unknown_ledger_and_unknown_entry(bookie: BookieUnderTest) -> None:
    known, unknown = new_ledger(), new_ledger()
    async with connected(bookie.address) as connection:
        await connection.add(entry(known, 0), KEY)
        with pytest.raises(NoSuchEntry, match="1"):
            await connection.read(known, 1)
        for call in (
            connection.read(unknown, 0),
            connection.read(unknown, -1),
            connection.read_lac(unknown),
            connection.ledger_info(unknown),
            connection.get_list_of_entries(unknown),
        ):
            with pytest.raises(NoSuchLedger):
                await call


async def test_a_list_of_entries_of_ledgers_answers_each_in_order_over_as_many_replies_as_fit(
    bookie: BookieUnderTest,
) -> None:
    """Known ledgers with their entries, an unknown one as NoSuchLedger in its place; with
    more than one frame holds (the bookie's frame limit is 16 KiB), a reply answers a prefix
    and the rest is asked again."""
    known = [new_ledger() for _ in range(3)]
    unknown = new_ledger()
    for number, ledger in enumerate(known):
        await add_all(bookie.address, [entry(ledger, i) for i in range(number + 1)])
    asked = [known[0], unknown, *known[1:]]
    async with connected(bookie.address) as connection:
        answered = await connection.get_lists_of_entries(asked)
        assert [record.ledger_id for record in answered] == asked
        held = {record.ledger_id: record for record in answered}
        for number, ledger in enumerate(known):
            assert held[ledger].error() is None
            assert list(EntryAvailability.from_bytes(held[ledger].availability)) == list(
                range(number + 1)
            )
        assert isinstance(held[unknown].error(), NoSuchLedger)

        scattered = new_ledger()  # 20 runs at growing gaps: a record of about 550 bytes
        await add_all(bookie.address, [entry(scattered, k * (k + 3)) for k in range(20)])
        many = [scattered] * MAX_LEDGERS_PER_LIST  # about 70 KiB of records: 5 frames
        replies = []
        while many:
            reply = await connection.get_lists_of_entries(many)
            replies.append(len(reply))
            many = many[len(reply) :]
        assert len(replies) > 1
        assert sum(replies) == MAX_LEDGERS_PER_LIST


async def test_read_entries_answers_a_prefix_and_never_an_entry_it_lacks_as_missing(
    bookie: BookieUnderTest,
) -> None:
    """READ_ENTRIES answers the entries asked in order, up to its byte budget and the
    frame (16 KiB here); it stops before an entry it does not hold, which is then asked
    alone: only an entry asked first is answered with its error."""
    ledger = new_ledger()
    held = [0, 1, 2, 4, 5]
    entries = {i: entry(ledger, i, b"%d" % i * 900) for i in held}
    await add_all(bookie.address, list(entries.values()))
    async with connected(bookie.address) as connection:
        assert await connection.read_entries(ledger, [0, 2, 5], 1 << 20) == (
            entries[0],
            entries[2],
            entries[5],
        )
        assert await connection.read_entries(ledger, [1, 2, 4, 5], 1) == (entries[1],)
        assert await connection.read_entries(ledger, [0, 1, 2, 3, 4], 1 << 20) == (
            entries[0],
            entries[1],
            entries[2],
        )
        with pytest.raises(NoSuchEntry, match="3"):
            await connection.read_entries(ledger, [3, 4], 1 << 20)
        with pytest.raises(NoSuchLedger):
            await connection.read_entries(new_ledger(), [0, 1], 1 << 20)

        large = new_ledger()  # 6 entries of 5 KiB: about 31 KiB, over the 16 KiB frame
        big = [entry(large, i, bytes([i]) * 5000) for i in range(6)]
        await add_all(bookie.address, big)
        answered: list[bytes] = []
        while len(answered) < len(big):
            reply = await connection.read_entries(large, range(len(answered), 6), 1 << 20)
            assert 1 <= len(reply) <= 3
            answered.extend(reply)
        assert answered == big


async def test_read_entries_fits_the_clients_frame_when_the_bookies_is_larger(
    cluster: str, tmp_path: Path
) -> None:
    """A bookie allowed frames over the protocol's default answers READ_ENTRIES within the
    default, which is what clients read with: the entry that would take the reply past it
    is left for the next request, not sent in a frame the client must refuse."""
    large = 8 << 20
    settings = {"max_frame_size": large, "receive_buffer_limit_bytes": 2 * large}
    with running(BookieUnderTest(cluster, tmp_path / "bookie", settings=settings)) as started:
        ledger = new_ledger()
        entries = [entry(ledger, 0, b"a" * (900 << 10)), entry(ledger, 1, b"b" * (4500 << 10))]
        await add_all(started.address, entries)
        async with connected(started.address) as connection:
            assert await connection.read_entries(ledger, [0, 1], 1 << 20) == (entries[0],)
            assert await connection.read_entries(ledger, [1], 1 << 20) == (entries[1],)
            assert not connection.closed


async def test_a_re_add_is_idempotent_for_the_reader(bookie: BookieUnderTest) -> None:
    ledger = new_ledger()
    async with connected(bookie.address) as connection:
        await connection.add(entry(ledger, 0), KEY)
        await connection.add(entry(ledger, 0), KEY)
        assert await connection.read(ledger, 0) == entry(ledger, 0)
        info = await connection.ledger_info(ledger)
        assert (info.entry_count, info.byte_count) == (1, len(entry(ledger, 0)))


async def test_large_entries_received_in_place_read_back_intact_across_checkpoints(
    tmp_path: Path,
) -> None:
    """Entries of KEEP_IN_PLACE bytes and more stay views of the arenas they arrived in until
    a checkpoint lets them go and the arenas are received into again: with a write cache of
    1 MiB, each round of adds on two connections fills it and is checkpointed, and every
    entry still reads back as it was sent, from the cache or from disk."""
    async with in_process_bookie(tmp_path / "bookie", write_cache_max_bytes=1 << 20) as node:
        storage = node.bookie.storage
        ledgers = [new_ledger(), new_ledger()]
        sent = {
            ledger: [entry(ledger, i, bytes([i % 251]) * 3 * KEEP_IN_PLACE) for i in range(120)]
            for ledger in ledgers
        }

        async def add(ledger: LedgerId, start: int) -> None:
            async with connected(node.address) as connection:
                batch = sent[ledger][start : start + 30]
                await asyncio.gather(*(connection.add_nowait(data, KEY) for data in batch))

        for start in range(0, 120, 30):
            before = storage.stats().checkpoints
            await asyncio.gather(*(add(ledger, start) for ledger in ledgers))

            async def checkpointed(before: int = before) -> bool:
                return storage.stats().checkpoints > before

            await until(checkpointed, "a checkpoint")
        async with connected(node.address) as connection:
            for ledger in ledgers:
                for entry_id, data in enumerate(sent[ledger]):
                    assert await connection.read(ledger, entry_id) == data
        assert node.bookie.receive_arenas.waiting > 0


async def test_write_lac_and_read_lac(bookie: BookieUnderTest) -> None:
    ledger = new_ledger()
    async with connected(bookie.address) as connection:
        for i in range(3):
            await connection.add(entry(ledger, i), KEY)
        assert await connection.read_lac(ledger) == 1
        await connection.write_lac(ledger, KEY, 2)
        assert await connection.read_lac(ledger) == 2
        await connection.write_lac(ledger, KEY, 0)  # a lower explicit LAC changes nothing
        assert await connection.read_lac(ledger) == 2
        with pytest.raises(Unauthorized):
            await connection.write_lac(ledger, OTHER_KEY, 10)
        assert await connection.read_lac(ledger) == 2


async def test_ledger_info(bookie: BookieUnderTest) -> None:
    ledger = new_ledger()
    entries = [entry(ledger, i, bytes(100 * i)) for i in range(3)]
    async with connected(bookie.address) as connection:
        for data in entries:
            await connection.add(data, KEY)
        expected = LedgerInfo(False, 1, 3, sum(map(len, entries)))
        assert await connection.ledger_info(ledger) == expected
        await connection.read(ledger, 2, fencing_key=KEY)
        assert (await connection.ledger_info(ledger)).fenced


# --- master key and fencing -----------------------------------------------------------------


async def test_the_first_add_fixes_the_master_key(bookie: BookieUnderTest) -> None:
    ledger = new_ledger()
    async with connected(bookie.address) as connection:
        await connection.add(entry(ledger, 0), KEY)
        with pytest.raises(Unauthorized, match="master key"):
            await connection.add(entry(ledger, 1), OTHER_KEY)
        with pytest.raises(Unauthorized):
            await connection.add(entry(ledger, 1), OTHER_KEY, recovery=True)
        with pytest.raises(Unauthorized):
            await connection.read(ledger, 0, fencing_key=OTHER_KEY)
        # Refused requests left no trace: no entry 1, no fence, the writer goes on.
        assert not (await connection.ledger_info(ledger)).fenced
        with pytest.raises(NoSuchEntry):
            await connection.read(ledger, 1)
        await connection.add(entry(ledger, 1), KEY)
        assert await connection.read(ledger, 1) == entry(ledger, 1)


async def test_fencing_stops_normal_adds_but_not_recovery_adds(bookie: BookieUnderTest) -> None:
    ledger = new_ledger()
    async with connected(bookie.address) as writer, connected(bookie.address) as recovery:
        for i in range(3):
            await writer.add(entry(ledger, i), KEY)
        assert await recovery.read(ledger, -1, fencing_key=KEY) == entry(ledger, 2)
        with pytest.raises(LedgerFenced):
            await writer.add(entry(ledger, 3), KEY)
        with pytest.raises(NoSuchEntry):
            await writer.read(ledger, 3)
        # Recovery re-writes what it read (with its own LAC) and may go past the end.
        await recovery.add(entry(ledger, 2, lac=2), KEY, recovery=True)
        await recovery.add(entry(ledger, 3, lac=2), KEY, recovery=True)
        assert await writer.read(ledger, 3) == entry(ledger, 3, lac=2)
        # Fencing again is harmless and the fence stays.
        assert await recovery.read(ledger, 0, fencing_key=KEY) == entry(ledger, 0)
        with pytest.raises(LedgerFenced):
            await writer.add(entry(ledger, 4), KEY)


async def test_fencing_a_ledger_the_bookie_never_saw(bookie: BookieUnderTest) -> None:
    """The fence (and the recovering client's key) is recorded even without entries, so a
    late first add of the old writer cannot slip in afterwards."""
    ledger = new_ledger()
    async with connected(bookie.address) as connection:
        with pytest.raises(NoSuchEntry):
            await connection.read(ledger, -1, fencing_key=KEY)
        assert await connection.ledger_info(ledger) == LedgerInfo(True, -1, 0, 0)
        with pytest.raises(LedgerFenced):
            await connection.add(entry(ledger, 0), KEY)
        with pytest.raises(Unauthorized):
            await connection.add(entry(ledger, 0), OTHER_KEY)


async def test_pipelined_fencing_reads_all_wait_for_the_fence(bookie: BookieUnderTest) -> None:
    ledger = new_ledger()
    async with connected(bookie.address) as connection:
        await connection.add(entry(ledger, 0), KEY)
        reads = [connection.read(ledger, 0, fencing_key=KEY) for _ in range(20)]
        assert await asyncio.gather(*reads) == [entry(ledger, 0)] * 20
        with pytest.raises(LedgerFenced):
            await connection.add(entry(ledger, 1), KEY)


# --- end-to-end checksum --------------------------------------------------------------------


async def test_an_add_whose_crc_does_not_match_is_refused_and_not_stored(
    bookie: BookieUnderTest,
) -> None:
    fresh, known = new_ledger(), new_ledger()
    good = entry(known, 0)
    await add_all(bookie.address, [good])
    wrong_crc = entry(fresh, 0)
    corrupted = bytearray(entry(known, 1, b"sent as computed"))
    corrupted[-1] ^= 0x01  # the client's NIC flipped a bit after the CRC was computed
    raw = await RawConnection.open(bookie.address)
    try:
        await raw.send(
            AddRequest(1, wrong_crc, KEY, crc32c(wrong_crc) ^ 0x8000).encode()
            + AddRequest(
                2, bytes(corrupted), KEY, crc32c(entry(known, 1, b"sent as computed"))
            ).encode()
        )
        for response in await raw.responses(2):
            assert isinstance(response, ErrorResponse)
            assert isinstance(response.error(), BadDigest), response
            assert "CRC32C" in response.message
        # The stream is intact after a BadDigest: the same connection still answers.
        await raw.send(ReadRequest(3, known, 0).encode())
        (answer,) = await raw.responses(1)
        assert answer == ReadResponse(3, known, 0, good)
    finally:
        await raw.close()
    async with connected(bookie.address) as connection:
        with pytest.raises(NoSuchLedger):
            await connection.read(fresh, 0)
        with pytest.raises(NoSuchEntry):
            await connection.read(known, 1)
        assert list(await connection.get_list_of_entries(known)) == [0]
        assert await connection.read_lac(known) == -1  # entry 1's piggy-backed LAC is not in
        await connection.add(entry(known, 1), KEY)  # the honest retry goes through


async def test_adds_received_together_are_each_answered_as_alone(
    bookie: BookieUnderTest,
) -> None:
    """One send, read by the bookie in one receive: runs of one ledger's adds go as a batch,
    and a refused add in a batch is refused alone."""
    ledger, other, doomed = new_ledger(), new_ledger(), new_ledger()
    await add_all(bookie.address, [entry(ledger, 0)])  # the ledger's key is KEY
    bad = entry(ledger, 3)
    adds = [
        AddRequest.for_entry(1, entry(ledger, 1), KEY),
        AddRequest.for_entry(2, entry(ledger, 2), KEY),
        AddRequest(3, bad, KEY, crc32c(bad) ^ 1),  # a bad CRC32C, amid good adds
        AddRequest.for_entry(4, entry(ledger, 4), KEY),
        AddRequest.for_entry(5, entry(other, 0), KEY),  # another ledger, a run of its own
        AddRequest.for_entry(6, entry(other, 1), KEY),
        AddRequest.for_entry(7, entry(ledger, 5), OTHER_KEY),  # the wrong key
        AddRequest.for_entry(8, entry(ledger, 6), OTHER_KEY),
        AddRequest.for_entry(9, entry(ledger, 3), KEY, recovery=True),  # one by one
        AddRequest.for_entry(10, entry(ledger, 7), KEY),
        AddRequest(11, entry(doomed, 0), KEY, crc32c(entry(doomed, 0)) ^ 1),  # all refused:
        AddRequest(12, entry(doomed, 1), KEY, crc32c(entry(doomed, 1)) ^ 1),  # no ledger
    ]
    before = bookie.metrics()
    raw = await RawConnection.open(bookie.address)
    try:
        await raw.send(b"".join(add.encode() for add in adds))
        answers = {response.request_id: response for response in await raw.responses(12)}
    finally:
        await raw.close()
    after = bookie.metrics()
    refused = {
        request_id: type(answer.error())
        for request_id, answer in answers.items()
        if isinstance(answer, ErrorResponse)
    }
    assert refused == {3: BadDigest, 7: Unauthorized, 8: Unauthorized, 11: BadDigest, 12: BadDigest}
    async with connected(bookie.address) as connection:
        assert list(await connection.get_list_of_entries(ledger)) == [0, 1, 2, 3, 4, 7]
        assert list(await connection.get_list_of_entries(other)) == [0, 1]
        with pytest.raises(NoSuchLedger):
            await connection.get_list_of_entries(doomed)
        assert await connection.read(ledger, 3) == entry(ledger, 3)  # the recovery add's
        assert await connection.read(ledger, 7) == entry(ledger, 7)
        assert await connection.read_lac(ledger) == 6
    ok = sample(after, "bookie_requests_total", operation="ADD", result="ok") - sample(
        before, "bookie_requests_total", operation="ADD", result="ok"
    )
    assert ok == 7
    assert (
        sample(after, "bookie_add_entry_seconds_count")
        - sample(before, "bookie_add_entry_seconds_count")
        == 7
    )


# --- the wire: frames that cannot be read ---------------------------------------------------

BAD_STREAMS = {
    "garbage": (b"\x00\x00\x00\x30" + b"\xff" * 48, "protocol version 255 is unknown"),
    "oversized": (struct.pack(">I", MAX_FRAME_SIZE + 1), f"exceeds the limit of {MAX_FRAME_SIZE}"),
    "shorter than a header": (b"\x00\x00\x00\x03abc", "shorter than the 36-byte request header"),
    "cut short": (ReadRequest(9, LedgerId(0, 1), 0).encode()[:20], "unfinished frame"),
}


@pytest.mark.parametrize("case", sorted(BAD_STREAMS))
async def test_a_bad_frame_closes_only_its_connection(bookie: BookieUnderTest, case: str) -> None:
    data, reason = BAD_STREAMS[case]
    before = bookie.metrics()
    ledger = new_ledger()
    async with connected(bookie.address) as healthy:
        await healthy.add(entry(ledger, 0), KEY)
        bad = await RawConnection.open(bookie.address)
        try:
            await bad.send(data)
            if case == "cut short":
                await bad.end()
            assert await bad.closed_by_bookie()
        finally:
            await bad.close()
        await healthy.add(entry(ledger, 1), KEY)
        assert await healthy.read(ledger, 1) == entry(ledger, 1)
    async with connected(bookie.address) as newcomer:
        assert await newcomer.read(ledger, 0) == entry(ledger, 0)

    def counted() -> float:
        return sample(bookie.metrics(), "bookie_malformed_frames_total") - sample(
            before, "bookie_malformed_frames_total"
        )

    async def once() -> bool:
        return counted() >= 1

    await until(once, "malformed frame counted")
    assert counted() == 1
    assert reason in bookie.log()


# --- availability dump ----------------------------------------------------------------------


async def test_availability_dump_streams_every_ledger_over_many_frames(
    bookie: BookieUnderTest,
) -> None:
    ledgers = [LedgerId(DUMP_SCOPE, i) for i in range(DUMP_LEDGERS)]
    # Ledger i holds entries 0..(i % 3): three different availabilities.
    await add_all(
        bookie.address, [entry(ledger, e) for ledger in ledgers for e in range(ledger.id % 3 + 1)]
    )
    raw = await RawConnection.open(bookie.address)
    frames: list[AvailabilityDumpResponse] = []
    try:
        await raw.send(AvailabilityDumpRequest(0).encode())
        while not frames or not frames[-1].stream_end:
            (frame,) = await raw.responses(1)
            assert isinstance(frame, AvailabilityDumpResponse), frame
            frames.append(frame)
    finally:
        await raw.close()
    assert len(frames) > 10
    for frame in frames:
        assert RESPONSE_HEADER_SIZE + sum(r.record_size for r in frame.records) <= MAX_FRAME_SIZE
    records = [record for frame in frames for record in frame.records]
    ids = [record.ledger_id for record in records]
    assert ids == sorted(ids), "a dump walks the ledgers in id order"
    mine = {r.ledger_id: r.entries() for r in records if r.ledger_id.scope == DUMP_SCOPE}
    assert mine == {
        ledger: EntryAvailability.from_entries(range(ledger.id % 3 + 1)) for ledger in ledgers
    }
    async with connected(bookie.address) as connection:
        assert [r async for r in connection.availability_dump()] == records


async def test_a_dump_with_state_gives_the_cookie_and_each_ledger_s_state(
    bookie: BookieUnderTest,
) -> None:
    """What a metadata recovery reads of a running bookie (issue 18)."""
    from tally.metadata.cookies import Cookie
    from tests.support.ledgers import rotating_ledger

    copied, plain = LedgerId(STATE_SCOPE, 1), LedgerId(STATE_SCOPE, 2)
    copy = rotating_ledger(1, 1, 1, [], None).to_bytes()
    await add_all(bookie.address, [entry(copied, e, lac=e - 1) for e in range(4)])
    await add_all(bookie.address, [entry(plain, 0)])
    async with connected(bookie.address) as connection:
        await connection.metadata_copy_nowait(copied, KEY, copy)
        await connection.read(plain, 0, fencing_key=KEY)
        records = [record async for record in connection.state_dump()]
    first, *rest = records
    assert first.kind is StateKind.COOKIE
    assert Cookie.from_bytes(first.cookie, "the dump").bookie_id == bookie.address
    mine = {record.ledger_id: record for record in rest if record.ledger_id.scope == STATE_SCOPE}
    assert mine == {
        copied: StateRecord.held(
            copied,
            EntryAvailability.span(0, 3).to_bytes(),
            fenced=False,
            last_add_confirmed=2,
            master_key=KEY,
            metadata_copy=copy,
        ),
        plain: StateRecord.held(
            plain,
            EntryAvailability.span(0, 0).to_bytes(),
            fenced=True,
            last_add_confirmed=-1,
            master_key=KEY,
            metadata_copy=None,
            digest_type=DigestType.CRC32C,  # no copy: its entry tells it
        ),
    }
    assert all(record.kind is StateKind.LEDGER for record in rest)


async def test_a_ledger_too_large_for_a_dump_frame_ends_the_dump_with_an_error(
    tmp_path: Path,
) -> None:
    """The error reaches the client (no hang until its timeout); the connection goes on."""
    ledger = LedgerId(0, 1)
    scattered = [k * (k + 1) // 2 for k in range(400)]  # ever wider gaps: ~200 groups
    async with in_process_bookie(tmp_path / "bookie", max_frame_size=4096) as node:
        await add_all(node.address, [entry(ledger, i) for i in scattered])
        async with connected(node.address, request_timeout=20.0) as connection:
            started = time.monotonic()
            with pytest.raises(BadRequest, match="does not fit a dump frame"):
                [record async for record in connection.availability_dump()]
            assert time.monotonic() - started < 5
            assert await connection.read(ledger, 0) == entry(ledger, 0)


# --- metrics --------------------------------------------------------------------------------


async def test_metrics_count_adds_reads_and_fences_by_result(bookie: BookieUnderTest) -> None:
    ledger = new_ledger()
    entries = [entry(ledger, i, b"m" * 10 * i) for i in range(5)]
    before = bookie.metrics()
    async with connected(bookie.address) as connection:
        for data in entries:
            await connection.add(data, KEY)
        await connection.read(ledger, 0)
        await connection.read(ledger, -1)
        with pytest.raises(NoSuchEntry):
            await connection.read(ledger, 99)
        with pytest.raises(Unauthorized):
            await connection.add(entry(ledger, 5), OTHER_KEY)
        with pytest.raises(Unauthorized):
            await connection.read(ledger, 4, fencing_key=OTHER_KEY)
        await connection.read(ledger, 4, fencing_key=KEY)
        with pytest.raises(LedgerFenced):
            await connection.add(entry(ledger, 5), KEY)
        await connection.read_lac(ledger)
    after = bookie.metrics()

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    requests = "bookie_requests_total"
    assert delta(requests, operation="ADD", result="ok") == 5
    assert delta(requests, operation="ADD", result="Unauthorized") == 1
    assert delta(requests, operation="ADD", result="LedgerFenced") == 1
    assert delta(requests, operation="READ", result="ok") == 2
    assert delta(requests, operation="READ", result="NoSuchEntry") == 1
    assert delta(requests, operation="FENCE", result="ok") == 1
    assert delta(requests, operation="FENCE", result="Unauthorized") == 1
    assert delta(requests, operation="READ_LAC", result="ok") == 1
    assert delta("bookie_add_entry_seconds_count") == 5
    assert 0 < delta("bookie_add_entry_seconds_sum") < 5
    assert delta("bookie_ledger_storage_entries_added_total") == 5
    assert delta("bookie_ledger_storage_bytes_added_total") == sum(map(len, entries))
    # Journal: the master key, five entries, the fence; in one or more group commits.
    assert delta("bookie_journal_records_total") == 7
    assert 1 <= delta("bookie_journal_batches_total") <= 7
    assert delta("bookie_journal_bytes_total") > sum(map(len, entries))
    p50 = sample(after, "bookie_journal_sync_seconds_p50")
    p99 = sample(after, "bookie_journal_sync_seconds_p99")
    assert 0 < p50 <= p99 < 5
    assert sample(after, "bookie_index_bytes") > 0
    assert 0 < sample(after, "bookie_ledger_disk_usage_ratio") < 1
    assert sample(after, "bookie_read_only") == 0


async def test_the_connections_gauge_follows_open_connections(bookie: BookieUnderTest) -> None:
    def open_connections() -> float:
        return sample(bookie.metrics(), "bookie_connections")

    baseline = open_connections()
    async with connected(bookie.address) as one, connected(bookie.address) as two:
        for connection in (one, two):  # a round trip: the bookie has accepted it
            with pytest.raises(NoSuchLedger):
                await connection.read_lac(new_ledger())
        assert open_connections() == baseline + 2

    async def back_down() -> bool:
        return open_connections() == baseline

    await until(back_down, "the connections gauge back down")
