"""The memory that frame readers receive bytes into, reused once nobody looks at it.

A bookie keeps a large entry as a view of the arena it arrived in (protocol.KEEP_IN_PLACE),
so an arena lives until the write cache lets go of its last entry. A fresh arena costs its
zeroing and page faults (docs/benchmarks.md); retired arenas wait here and are taken again
once free. Arenas retire roughly in the order the write cache releases them, so only the oldest
is ever checked.
"""

from __future__ import annotations

import sys
from collections import deque

from tally.core.errors import BadRequest

MIN_RECEIVE = 64 << 10
"""The least room a reader offers for one receive: smaller reads cost a system call each."""
DEFAULT_ARENA_SIZE = 256 << 10
"""What asyncio reads at once by default; a bookie's arenas are larger (server.py)."""


class ReceiveArenas:
    """A pool of receive arenas of `arena_size` bytes, keeping at most `retained` of them.

    An arena is free when the pool holds the only reference to it: any view of its bytes
    holds one (through the buffer it exports), so CPython's reference count says whether
    a view is left. Arenas of other sizes (for frames larger than one) are never kept.
    """

    __slots__ = ("_retired", "arena_size", "retained")

    def __init__(self, arena_size: int = DEFAULT_ARENA_SIZE, retained: int = 8) -> None:
        if arena_size < 2 * MIN_RECEIVE or retained < 0:
            raise BadRequest(
                f"receive arenas of {arena_size} bytes, {retained} retained: an arena holds at "
                f"least two receives ({2 * MIN_RECEIVE} bytes) and none retained is the least"
            )
        self.arena_size = arena_size
        self.retained = retained
        self._retired: deque[bytearray] = deque()

    def take(self, size: int) -> bytearray:
        """An arena of `size` bytes: the oldest retired one if free, else a new one."""
        retired = self._retired
        if size == self.arena_size and retired and sys.getrefcount(retired[0]) == _ONLY_OURS:
            return retired.popleft()
        return bytearray(size)

    def give_back(self, arena: bytearray) -> None:
        """Retire `arena` (views of it may live on); the oldest goes when too many wait."""
        if len(arena) != self.arena_size or not self.retained:
            return
        self._retired.append(arena)
        if len(self._retired) > self.retained:
            self._retired.popleft()

    @property
    def waiting(self) -> int:
        """Arenas retired and not taken again (free or still viewed)."""
        return len(self._retired)


_ONLY_OURS = 2
"""getrefcount of an arena only the pool holds: the deque's reference and the argument's."""
