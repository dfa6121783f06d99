"""The frame readers: a byte stream, received into arenas in chunks split anywhere, cut into
frames, each decoded where it lies."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import ClassVar, Final, Generic, TypeAlias, TypeVar

from tally.core.entry_format import header_ids
from tally.core.errors import BadRequest, MalformedData
from tally.core.ids import LedgerId
from tally.core.protocol.decoding import (
    KEEP_IN_PLACE,
    REQUEST_DECODERS,
    RESPONSE_DECODERS,
    RequestDecoder,
    decode_add,
    utf8,
)
from tally.core.protocol.requests import AddRequest, Request
from tally.core.protocol.responses import AddResponse, ErrorResponse, Response
from tally.core.protocol.wire import (
    ADD_FIXED,
    ADD_RESPONSE,
    LENGTH,
    MAX_FRAME_SIZE,
    RECOVERY_ADD,
    REQUEST,
    REQUEST_HEADER_SIZE,
    RESPONSE,
    RESPONSE_HEADER_SIZE,
    RULES,
    STREAM_END,
    VERSION,
    WITH_STATE,
    Operation,
    check_header,
    frame_operation,
)
from tally.core.receive_arenas import MIN_RECEIVE, ReceiveArenas

_Message = TypeVar("_Message")
_Buffer: TypeAlias = bytes | bytearray | memoryview
_AVAILABILITY_DUMP: Final = int(Operation.AVAILABILITY_DUMP)
_ADD: Final = int(Operation.ADD)
_ADD_FLAGS: Final = RULES[Operation.ADD].flags


class FrameReader(ABC, Generic[_Message]):
    """Turns a byte stream, received in chunks split anywhere, into messages.

    The bytes are received into an arena (`get_buffer`, then `buffer_updated` with how many
    arrived; or `feed`, which copies them in) and each frame is decoded where it lies, so a
    large entry can stay there as a view instead of being copied out: such a view keeps its
    arena alive, and the reader then starts a new arena rather than reuse it. A frame never
    spans two arenas: the part of one already received moves to the next. A frame's length
    is checked as soon as its prefix is complete, so at most one frame (`max_frame_size`)
    and a receive's worth more are ever buffered.
    """

    __slots__ = (
        "_arena",
        "_arenas",
        "_end",
        "_failure",
        "_kept_bytes",
        "_ledger_id",
        "_max_frame_size",
        "_offset",
        "_start",
    )

    _kind: ClassVar[str]
    _header_size: ClassVar[int]

    def __init__(
        self, max_frame_size: int = MAX_FRAME_SIZE, arenas: ReceiveArenas | None = None
    ) -> None:
        if not self._header_size <= max_frame_size < 1 << 32:
            raise BadRequest(
                f"max frame size {max_frame_size} is outside "
                f"{self._header_size}..{(1 << 32) - 1} (the {self._kind} header to 2^32-1)"
            )
        self._max_frame_size = max_frame_size
        self._arenas = ReceiveArenas() if arenas is None else arenas
        self._arena = memoryview(self._arenas.take(self._arenas.arena_size))
        self._start = 0
        """Where the first frame not yet decoded begins in the arena."""
        self._end = 0
        """Where the received bytes end in the arena."""
        self._kept_bytes = 0
        """Bytes of the arena that decoded messages hold views of."""
        self._offset = 0
        self._failure: str | None = None
        self._ledger_id = LedgerId(0, 0)
        """The ledger of the last ADD decoded: a writer's adds and answers name the same one."""

    def _ledger(self, scope: int, ledger: int) -> LedgerId:
        """LedgerId(scope, ledger), the last one's again when it names the same ledger."""
        ledger_id = self._ledger_id
        if ledger_id.id != ledger or ledger_id.scope != scope:
            ledger_id = self._ledger_id = LedgerId(scope, ledger)
        return ledger_id

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame; non-zero at end of stream means it was cut short."""
        return self._end - self._start

    @property
    def unfinished_frame_size(self) -> int:
        """The length of the frame begun and not complete, once its prefix is in (what
        `get_buffer` makes room for); 0 before that and between frames."""
        if self._end - self._start < LENGTH.size:
            return 0
        return int(LENGTH.unpack_from(self._arena, self._start)[0])

    def get_buffer(self) -> memoryview:
        """Where to receive the next bytes: at least MIN_RECEIVE of room, and room for the
        whole of the frame begun, so that it lies in one piece."""
        arena, start, end = self._arena, self._start, self._end
        needed = MIN_RECEIVE
        if end - start >= LENGTH.size:
            frame_size = LENGTH.size + LENGTH.unpack_from(arena, start)[0]
            if frame_size <= LENGTH.size + self._max_frame_size:
                needed = max(needed, frame_size - (end - start))
        if len(arena) - end < needed:
            self._move_to_new_arena(needed)
        return self._arena[self._end :]

    def _move_to_new_arena(self, needed: int) -> None:
        pending = self._end - self._start
        size = max(self._arenas.arena_size, pending + needed)
        old = self._arena
        if self._kept_bytes or size > len(old):
            self._arena = memoryview(self._arenas.take(size))
            self._kept_bytes = 0
            self._arena[:pending] = old[self._start : self._end]
            self._arenas.give_back(old.obj)  # type: ignore[arg-type]
        else:
            self._arena[:pending] = old[self._start : self._end]
        self._start, self._end = 0, pending

    def release(self) -> None:
        """Give the arena back to the pool: the stream is over (views of it may live on)."""
        arena = self._arena.obj
        self._arena = memoryview(bytearray())
        self._start = self._end = self._kept_bytes = 0
        self._arenas.give_back(arena)  # type: ignore[arg-type]

    def buffer_updated(self, nbytes: int) -> list[_Message]:
        """The messages completed by the `nbytes` just received into `get_buffer()`, in order.

        Raises MalformedData for a frame that cannot be taken; the reader then refuses every
        later call, since the stream position is lost.
        """
        if self._failure is not None:
            raise MalformedData(
                f"the {self._kind} stream is unusable after an earlier error: {self._failure}"
            )
        if not 0 <= nbytes <= len(self._arena) - self._end:
            raise BadRequest(f"{nbytes} bytes received into {len(self._arena) - self._end}")
        self._end += nbytes
        try:
            return self._decode_complete()
        except MalformedData as error:
            self._failure = f"{error} (frame at stream offset {self._offset})"
            self._start = self._end
            raise MalformedData(self._failure) from None

    def feed(self, data: _Buffer) -> list[_Message]:
        """The messages completed by `data` (copied in; the caller may reuse its buffer)."""
        view = _byte_view(data)
        messages: list[_Message] = []
        pos = 0
        while True:
            room = self.get_buffer()
            taken = min(len(room), len(view) - pos)
            room[:taken] = view[pos : pos + taken]
            pos += taken
            messages += self.buffer_updated(taken)
            if pos == len(view):
                return messages

    def _decode_complete(self) -> list[_Message]:
        messages: list[_Message] = []
        arena, pos, end = self._arena, self._start, self._end
        header_size, max_frame_size = self._header_size, self._max_frame_size
        while end - pos >= LENGTH.size:
            (length,) = LENGTH.unpack_from(arena, pos)
            if not header_size <= length <= max_frame_size:
                self._refuse_length(length)
            stop = pos + LENGTH.size + length
            if stop > end:
                break
            messages.append(self._decode(arena, pos + LENGTH.size, stop))
            self._offset += stop - pos
            pos = stop
        if pos == end and not self._kept_bytes:
            pos = end = self._end = 0
        self._start = pos
        return messages

    def _may_keep(self, size: int, stop: int) -> bool:
        """Whether `size` bytes ending at `stop` in the arena may stay a view of it: only
        while kept bytes are at least half of what the arena has received, so that a stream
        of other requests cannot have a few kept bytes hold whole arenas alive."""
        if 2 * (self._kept_bytes + size) < stop:
            return False
        self._kept_bytes += size
        return True

    def _refuse_length(self, length: int) -> None:
        """MalformedData for a frame length outside header size..max_frame_size."""
        if length > self._max_frame_size:
            raise MalformedData(
                f"frame of {length} bytes exceeds the limit of {self._max_frame_size}"
            )
        if length < self._header_size:
            raise MalformedData(
                f"frame of {length} bytes is shorter than the {self._header_size}-byte "
                f"{self._kind} header"
            )

    @abstractmethod
    def _decode(self, view: memoryview, start: int, stop: int) -> _Message:
        """The message of the frame in view[start:stop] (after its length prefix)."""


class RequestReader(FrameReader[Request]):
    """The bookie's side: decodes requests."""

    __slots__ = ()
    _kind = "request"
    _header_size = REQUEST_HEADER_SIZE

    def _decode(self, view: memoryview, start: int, stop: int) -> Request:
        _, version, op_byte, flags, request_id, scope, ledger, entry_id = REQUEST.unpack_from(
            view, start - LENGTH.size
        )
        if op_byte == _ADD and version == VERSION and not flags & ~_ADD_FLAGS and entry_id >= 0:
            # Adds are most of what a bookie receives: a well-formed one's header checks are
            # these, without the look-ups by operation the others take.
            named = (scope, ledger, entry_id)
            add = self._well_formed_add(view, start, stop, request_id, flags, named)
            if add is not None:
                return add
            operation, checked = Operation.ADD, True
            decode: RequestDecoder = decode_add
        else:
            operation = frame_operation(version, op_byte, response=False)
            decode, checked = REQUEST_DECODERS[operation], False
        try:
            if not checked:
                check_header(operation, flags, RULES[operation].flags, scope, ledger, entry_id)
            body = view[start + REQUEST_HEADER_SIZE : stop]
            request = decode(request_id, scope, ledger, entry_id, flags, body)
            if isinstance(request, AddRequest) and type(request.entry) is memoryview:
                return self._kept_or_copied(request, stop)
            return request
        except MalformedData as error:
            raise MalformedData(f"{operation.name} request {request_id}: {error}") from None

    def _well_formed_add(
        self,
        view: memoryview,
        start: int,
        stop: int,
        request_id: int,
        flags: int,
        named: tuple[int, int, int],
    ) -> AddRequest | None:
        """The ADD in view[start:stop] if its entry's header is well formed and names the
        (scope, ledger, entry id) its frame's header `named`: read once, with the frame's
        ledger id again if it is the last one's. None for `decode_add` to say what is wrong."""
        body = start + REQUEST_HEADER_SIZE
        ids = header_ids(view, body + ADD_FIXED.size, stop)
        if ids is None or ids[:3] != named:
            return None
        master_key, crc = ADD_FIXED.unpack_from(view, body)
        scope, ledger, entry_id, lac = ids
        entry: bytes | memoryview = view[body + ADD_FIXED.size : stop]
        if len(entry) < KEEP_IN_PLACE or not self._may_keep(len(entry), stop):
            entry = bytes(entry)
        recovery = bool(flags & RECOVERY_ADD)
        held = (self._ledger(scope, ledger), entry_id, lac)
        return AddRequest.decoded(request_id, entry, master_key, crc, recovery, held)

    def _kept_or_copied(self, request: AddRequest, stop: int) -> AddRequest:
        if self._may_keep(len(request.entry), stop):
            return request
        return replace(request, entry=bytes(request.entry))


class ResponseReader(FrameReader[Response]):
    """The client's side: decodes responses, errors as ErrorResponse."""

    __slots__ = ()
    _kind = "response"
    _header_size = RESPONSE_HEADER_SIZE

    def _decode(self, view: memoryview, start: int, stop: int) -> Response:
        _, version, op_byte, flags, request_id, scope, ledger, entry_id, status = (
            RESPONSE.unpack_from(view, start - LENGTH.size)
        )
        if (
            op_byte == ADD_RESPONSE
            and not status
            and not flags
            and entry_id >= 0
            and version == VERSION
            and stop - start == RESPONSE_HEADER_SIZE
        ):
            # A replicated add's answers are most of what a client receives: the one
            # well-formed shape they take is decoded here, past the general checks.
            return AddResponse(request_id, self._ledger(scope, ledger), entry_id)
        operation = frame_operation(version, op_byte, response=True)
        try:
            # A response's only flag ends a dump's stream; an error ends any request anyway.
            allowed = STREAM_END | WITH_STATE if operation == _AVAILABILITY_DUMP else 0
            check_header(operation, flags, allowed if not status else 0, scope, ledger, entry_id)
            ledger_id = LedgerId(scope, ledger)
            body = view[start + RESPONSE_HEADER_SIZE : stop]
            if status:
                message = utf8(body)
                return ErrorResponse(operation, request_id, ledger_id, entry_id, status, message)
            return RESPONSE_DECODERS[operation](request_id, ledger_id, entry_id, flags, body)
        except MalformedData as error:
            raise MalformedData(f"{operation.name} response {request_id}: {error}") from None


def _byte_view(data: _Buffer) -> memoryview:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BadRequest(f"feed takes bytes, bytearray or memoryview, not {type(data).__name__}")
    view = memoryview(data)
    if not view.c_contiguous:
        raise BadRequest("feed takes a contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")
