"""How much a bookie may hold of frames it has begun to receive and not finished, and when
such a frame has stalled.

A frame's length is known from its prefix, before its bytes arrive, and the reader then
makes room for all of it at once (protocol/readers.py): left alone, every slow sender of a
large frame holds that much of the bookie's memory. `ReceiveBudget` is shared by all the
connections of a bookie. A connection whose unfinished frame needs room the budget lacks is
not read until its turn comes (TCP's backpressure slows its sender; nothing is lost). Turns
are first come, first served, so that small frames never pass a large one forever; and the
budget holds at least the largest frame, so the first waiter fits once the frames being
received are done, each of which completes or has its connection closed when it stalls
(`ReceiveProgress`): nobody waits forever.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

from tally.core.errors import BadRequest

_Owner = TypeVar("_Owner", bound=Hashable)


class ReceiveBudget(Generic[_Owner]):
    """Bytes of unfinished frames, at most `limit`, held by owners (connections) one frame
    each, and the owners waiting for room in the order they asked."""

    __slots__ = ("_holds", "_queue", "held", "limit")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise BadRequest(f"a receive budget of {limit} bytes holds nothing")
        self.limit = limit
        self.held = 0
        """Bytes the owners hold now, at most `limit`."""
        self._holds: dict[_Owner, int] = {}
        self._queue: dict[_Owner, int] = {}
        """Waiting owners and the bytes each asked for, in the order they asked."""

    def hold(self, owner: _Owner, size: int) -> bool:
        """Let `owner` hold `size` bytes for its unfinished frame in place of what it held
        (0: it has none). True if it holds them now; False if it holds nothing and waits,
        behind every earlier waiter, until `admit` names it."""
        if not 0 <= size <= self.limit:
            raise BadRequest(f"a frame of {size} bytes does not fit a budget of {self.limit}")
        self._queue.pop(owner, None)
        self.held -= self._holds.pop(owner, 0)
        if not size:
            return True
        if self._queue or self.held + size > self.limit:
            self._queue[owner] = size
            return False
        self._holds[owner] = size
        self.held += size
        return True

    def release(self, owner: _Owner) -> None:
        """`owner` is gone: it holds nothing and waits for nothing."""
        self.hold(owner, 0)

    def admit(self) -> list[_Owner]:
        """The waiters whose turn has come, in order: each holds what it asked for now."""
        admitted: list[_Owner] = []
        queue = self._queue
        while queue:
            owner, size = next(iter(queue.items()))
            if self.held + size > self.limit:
                break
            del queue[owner]
            self._holds[owner] = size
            self.held += size
            admitted.append(owner)
        return admitted

    @property
    def waiting(self) -> int:
        """Owners waiting for room."""
        return len(self._queue)


class ReceiveProgress:
    """Since when one connection's unfinished frame has had no new byte while it was read.

    Only time spent reading counts: a connection that waits for the receive budget is not
    read, so its sender is not the one holding things up.
    """

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since: float | None = None
        """When the unfinished frame last got a byte, or was read again after a wait;
        None while there is no unfinished frame or the connection is not read."""

    def received(self, now: float, unfinished: bool) -> None:
        """Bytes arrived at `now`; `unfinished`: a frame is begun and not complete."""
        self.since = now if unfinished else None

    def paused(self) -> None:
        """The connection is not read (it waits for the budget)."""
        self.since = None

    def resumed(self, now: float) -> None:
        """The connection is read again, in the middle of a frame."""
        self.since = now

    def stalled(self, now: float, timeout: float) -> bool:
        """Whether the unfinished frame has had no byte for `timeout` seconds of reading."""
        return self.since is not None and now - self.since >= timeout
