"""128-bit ledger ids (BP-34): a scope and an id, two unsigned 64-bit halves.

Scope 0 holds the classic 64-bit ledger ids, so everything written before 128-bit ids
existed keeps its identity. The qualified name is the one textual form for people and
tools: 32 lowercase hex digits, scope first.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Self

from tally.core.errors import BadRequest

UINT64_MAX = (1 << 64) - 1
_QUALIFIED_NAME = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, order=True, slots=True)
class LedgerId:
    """A ledger's identity; orders by (scope, id), as the index and the metadata store do."""

    scope: int
    id: int

    def __post_init__(self) -> None:
        scope, ledger_id = self.scope, self.id
        # The common case in one test: a bookie makes an id for every request it decodes.
        if (
            type(scope) is int
            and type(ledger_id) is int
            and 0 <= scope <= UINT64_MAX
            and 0 <= ledger_id <= UINT64_MAX
        ):
            return
        for name, half in (("scope", scope), ("id", ledger_id)):
            if not isinstance(half, int) or isinstance(half, bool):
                raise BadRequest(f"ledger {name} must be an int, not {type(half).__name__}")
            if not 0 <= half <= UINT64_MAX:
                raise BadRequest(f"ledger {name} {half} is outside 0..2^64-1")

    @classmethod
    def classic(cls, ledger_id: int) -> Self:
        """A scope-0 id, the 64-bit ledger ids of Apache BookKeeper."""
        return cls(0, ledger_id)

    @classmethod
    def from_uuid(cls, value: uuid.UUID | None = None) -> Self:
        """A decentralised id from a UUID (random when none is given); never scope 0.

        Scope 0 is reserved for ids from the metadata store's sequence, so a random UUID
        whose top half is 0 (one chance in 2^64) is replaced rather than collide there.
        """
        while True:
            source = value if value is not None else uuid.uuid4()
            scope, ledger_id = source.int >> 64, source.int & UINT64_MAX
            if scope != 0:
                return cls(scope, ledger_id)
            if value is not None:
                raise BadRequest(f"UUID {value} has a zero top half; it would collide with scope 0")

    @classmethod
    def from_qualified_name(cls, name: str) -> Self:
        """Parse the 32-hex-digit form; anything else is refused with the reason."""
        if not isinstance(name, str):
            raise BadRequest(f"a qualified ledger name is a str, not {type(name).__name__}")
        if len(name) != 32:
            raise BadRequest(
                f"qualified ledger name {name!r} has {len(name)} characters; "
                "it must be exactly 32 lowercase hex digits (scope, then id)"
            )
        if not _QUALIFIED_NAME.fullmatch(name):
            raise BadRequest(
                f"qualified ledger name {name!r} must be 32 lowercase hex digits "
                "(0-9, a-f), scope then id"
            )
        return cls(int(name[:16], 16), int(name[16:], 16))

    @classmethod
    def parse(cls, value: LedgerId | int | str) -> LedgerId:
        """Accept what users type: a LedgerId, a classic int id, a decimal string or a
        qualified name."""
        if isinstance(value, LedgerId):
            return value
        if isinstance(value, bool):
            raise BadRequest("a ledger id cannot be a bool")
        if isinstance(value, int):
            return cls.classic(value)
        if isinstance(value, str):
            text = value.strip()
            if text.isdecimal() and len(text) != 32:
                return cls.classic(int(text))
            return cls.from_qualified_name(text)
        raise BadRequest(f"cannot read a ledger id from {type(value).__name__}")

    @property
    def qualified_name(self) -> str:
        return f"{self.scope:016x}{self.id:016x}"

    @property
    def is_classic(self) -> bool:
        return self.scope == 0

    def __int__(self) -> int:
        if self.scope != 0:
            raise BadRequest(
                f"ledger {self.qualified_name} has scope {self.scope}; only scope-0 ids are ints"
            )
        return self.id

    def __str__(self) -> str:
        return str(self.id) if self.scope == 0 else self.qualified_name

    def __repr__(self) -> str:
        return f"LedgerId(scope={self.scope}, id={self.id})"
